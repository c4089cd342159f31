//! Namespace changes: create, link, unlink, rmdir, rename.
//!
//! Write order keeps every crash state recoverable: a new inode document is
//! written before the entry that names it (a crash leaves at most an
//! unreferenced inode, which fsck reclaims), and a rename writes the new
//! entry before deleting the old one (a crash leaves the file reachable).

use super::*;
use crate::store::{Query, StoreResult};

/// What kind of node to make, with its kind-specific payload.
pub enum NewNode<'a> {
    File,
    Dir,
    Symlink(&'a [u8]),
    Special(Kind, u32),
}

pub const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
pub const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;

impl Fs {
    /// mknod/mkdir/symlink/create: make an inode and its first name.
    pub fn make_node(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        node: NewNode<'_>,
        mode: u32,
        umask: u32,
    ) -> FsResult<Inode> {
        let ename = encode_name(name)?;
        let _g = self.locks.dirs(&[parent]);
        // Lock first, then look: an rmdir (exclusive on the directory) by
        // another mount cannot slip in between the check and the create.
        let (_t, paths) = self.tree_lock(&[parent], &[])?;
        let dir = paths[0].clone();
        let (pinode, _) = self.get_inode(parent)?;
        if pinode.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if pinode.nlink == 0 {
            return Err(FsError::NotFound); // removed while we looked
        }
        if self.get_entry(parent, name)?.is_some() {
            return Err(FsError::Exists);
        }
        let (ino, cookie) = (self.alloc()?, self.alloc()?);
        let (kind, rdev, target) = match node {
            NewNode::File => (Kind::File, 0, None),
            NewNode::Dir => (Kind::Dir, 0, None),
            NewNode::Symlink(t) => (Kind::Symlink, 0, Some(encode_bytes(t))),
            NewNode::Special(k, rdev) => (k, rdev, None),
        };
        let mut mode = match kind {
            Kind::Symlink => 0o777,
            _ => mode & 0o7777 & !umask,
        };
        // BSD group semantics in setgid directories (as ext4 does).
        let mut gid = ctx.gid;
        if pinode.mode & libc::S_ISGID != 0 {
            gid = pinode.gid;
            if kind == Kind::Dir {
                mode |= libc::S_ISGID;
            }
        }
        let now = now_ns();
        // A symlink's size is the length of its target.
        let size = target
            .as_deref()
            .map_or(0, |t| decode_bytes(t).len() as u64);
        let inode = Inode {
            ino,
            kind,
            mode,
            uid: ctx.uid,
            gid,
            size,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            rdev,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            btime_ns: now,
            target,
            xattrs: Default::default(),
            content: (kind == Kind::File).then(|| ino.to_string()),
            links: vec![Link {
                p: parent,
                n: ename.clone(),
            }],
            orphan: false,
            // Nothing stored yet: the base a chunk store counts from.
            stored: (kind == Kind::File).then_some(0),
        };
        let mut entry = Entry {
            parent,
            name: ename.clone(),
            path: join_path(&dir, &ename),
            dir,
            ino,
            kind,
            cookie,
            size: 0,
            mtime: 0,
            mode: 0,
            uid: 0,
            gid: 0,
            contents: None,
            indexed: None,
            text_mtime_ns: None,
            xattrs: vec![],
        };
        entry.refresh_attrs(&inode);
        let eid = entry_id(parent, name);
        let res = self.store.bulk(vec![
            BulkOp::Create {
                index: Idx::Inodes,
                id: inode_id(ino),
                source: to_doc(&inode),
            },
            BulkOp::Create {
                index: Idx::Entries,
                id: eid.clone(),
                source: to_doc(&entry),
            },
        ])?;
        match (&res[0], &res[1]) {
            (Ok(_), Ok(_)) => {}
            (ri, re) => {
                // Undo whichever half landed.
                if ri.is_ok() {
                    let _ = self.store.delete(Idx::Inodes, &inode_id(ino), None);
                }
                if re.is_ok() {
                    let _ = self.store.delete(Idx::Entries, &eid, None);
                }
                return Err(match re {
                    Err(StoreError::Conflict(_)) => FsError::Exists,
                    Err(e) => e.clone().into(),
                    Ok(_) => ri.clone().unwrap_err().into(),
                });
            }
        }
        if kind == Kind::Dir {
            self.dirs.write().insert(ino, (parent, ename));
        }
        self.touch_dir(parent, if kind == Kind::Dir { 1 } else { 0 })?;
        Ok(inode)
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> FsResult<Inode> {
        let ename = encode_name(newname)?;
        let _g = self.locks.dirs(&[newparent]);
        let (_t, paths) = self.tree_lock(&[newparent], &[])?;
        let dir = paths[0].clone();
        let (target, _) = self.get_inode(ino)?;
        if target.kind == Kind::Dir {
            return Err(FsError::NotPermitted);
        }
        if target.nlink == 0 {
            return Err(FsError::NotFound);
        }
        let (pinode, _) = self.get_inode(newparent)?;
        if pinode.kind != Kind::Dir || pinode.nlink == 0 {
            return Err(if pinode.kind != Kind::Dir {
                FsError::NotDir
            } else {
                FsError::NotFound
            });
        }
        if target.nlink >= u32::MAX - 1 {
            return Err(FsError::TooManyLinks);
        }
        let mut entry = Entry {
            parent: newparent,
            name: ename.clone(),
            path: join_path(&dir, &ename),
            dir,
            ino,
            kind: target.kind,
            cookie: self.alloc()?,
            size: 0,
            mtime: 0,
            mode: 0,
            uid: 0,
            gid: 0,
            contents: None,
            indexed: None,
            text_mtime_ns: None,
            xattrs: vec![],
        };
        entry.refresh_attrs(&target);
        match self
            .store
            .create(Idx::Entries, &entry_id(newparent, newname), &to_doc(&entry))
        {
            Ok(_) => {}
            Err(StoreError::Conflict(_)) => return Err(FsError::Exists),
            Err(e) => return Err(e.into()),
        }
        let now = now_ns();
        let mark = self.settle_mark(ino);
        let inode = self.update_inode(ino, |i| {
            i.nlink += 1;
            i.ctime_ns = now;
            i.links.push(Link {
                p: newparent,
                n: ename.clone(),
            });
            Ok(())
        })?;
        self.touch_dir(newparent, 0)?;
        // The new name's entry gets the indexed text too.
        self.content_changed(ino);
        let mut inode = inode;
        if !self.overlay(&mut inode, mark) {
            inode = self.getattr(ino)?;
        }
        Ok(inode)
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        encode_name(name)?;
        let _g = self.locks.dirs(&[parent]);
        let (entry, _) = self.get_entry(parent, name)?.ok_or(FsError::NotFound)?;
        if entry.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let (_t, _) = self.tree_lock(&[parent], &[])?;
        // Re-read under the lock: another mount may have changed it.
        let (entry, ver) = self.get_entry(parent, name)?.ok_or(FsError::NotFound)?;
        if entry.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        self.delete_entry(parent, name, entry.ino, ver)?;
        self.drop_link(entry.ino, parent, &entry.name)?;
        self.touch_dir(parent, 0)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        if name == b"." {
            return Err(FsError::Invalid);
        }
        if name == b".." {
            return Err(FsError::NotEmpty);
        }
        encode_name(name)?;
        loop {
            // Lock the parent and the directory itself (creates inside it
            // lock it), in a deadlock-free sorted order, then re-check.
            let (peek, _) = self.get_entry(parent, name)?.ok_or(FsError::NotFound)?;
            let _g = self.locks.dirs(&[parent, peek.ino]);
            // Exclusive on the directory itself: no other mount can create
            // in it (creates hold it shared) while we check it is empty.
            let (_t, _) = self.tree_lock(&[parent], &[(parent, &peek.name)])?;
            let (entry, ver) = self.get_entry(parent, name)?.ok_or(FsError::NotFound)?;
            if entry.ino != peek.ino {
                continue;
            }
            if entry.kind != Kind::Dir {
                return Err(FsError::NotDir);
            }
            self.see_other_mounts()?;
            if !self.dir_is_empty(entry.ino)? {
                return Err(FsError::NotEmpty);
            }
            self.delete_entry(parent, name, entry.ino, ver)?;
            self.drop_link(entry.ino, parent, &entry.name)?;
            return self.touch_dir(parent, -1);
        }
    }

    /// Delete the entry `name` in `parent` if it still names `ino`. A version
    /// conflict from an attribute refresh of the same entry (a close racing
    /// with the unlink) is retried; the entry naming another inode is not.
    fn delete_entry(&self, parent: u64, name: &[u8], ino: u64, ver: Version) -> FsResult<()> {
        let id = entry_id(parent, name);
        let mut ver = ver;
        for _ in 0..MAX_RETRIES {
            match self.store.delete(Idx::Entries, &id, Some(ver)) {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
            let Some((cur, v)) = self.get_entry(parent, name)? else {
                return Err(FsError::NotFound);
            };
            if cur.ino != ino {
                return Err(FsError::Again);
            }
            ver = v;
        }
        Err(FsError::Again)
    }

    /// Searches are near-real-time on Elasticsearch: under an exclusive
    /// lock, make the changes other mounts finished before it visible.
    /// (A mount's own writes are always visible to its searches.)
    fn see_other_mounts(&self) -> FsResult<()> {
        if !self.cfg.exclusive {
            self.store.refresh(Idx::Entries)?;
        }
        Ok(())
    }

    pub(super) fn dir_is_empty(&self, ino: u64) -> FsResult<bool> {
        Ok(self
            .store
            .count(Idx::Entries, &Query::term("parent", ino))?
            == 0)
    }

    /// One name of `ino` is gone: drop the link; at zero links delete the
    /// inode, unless it is still in use (then the last close or forget does).
    pub(super) fn drop_link(&self, ino: u64, parent: u64, ename: &str) -> FsResult<()> {
        let now = now_ns();
        // An open handle, or the kernel's reference, keeps an unlinked inode
        // alive until the forget: a directory may be a process's cwd, and in
        // no-open mode (exclusive mounts) a file may be open without esfs
        // knowing, with its writes still in the kernel's page cache. With
        // OPEN/RELEASE (Elasticsearch) a file only the kernel remembers
        // cannot be reached by name any more, so its document goes now; an
        // open(2) racing this (its lookup came first) must not register on
        // it meanwhile and read contents being deleted: until the document
        // is gone such an open gets ESTALE and looks the name up again.
        let (open, dying) = {
            let states = self.open.lock(); // held while marking: see register_open
            let open = states.contains_key(&ino);
            let dying = !open && !self.cfg.exclusive;
            if dying {
                self.dying.lock().insert(ino);
            }
            (open, dying)
        };
        let r = self.drop_link_marked(ino, parent, ename, open, now);
        if dying {
            self.dying.lock().remove(&ino);
        }
        r
    }

    fn drop_link_marked(
        &self,
        ino: u64,
        parent: u64,
        ename: &str,
        open: bool,
        now: i64,
    ) -> FsResult<()> {
        let referenced = open || self.lookups.lock().contains_key(&ino);
        let keep_file = if self.cfg.exclusive { referenced } else { open };
        let (i, fate) = self.change_inode(ino, |i| {
            // Idempotent (crash recovery re-runs it): only a present link counts.
            if let Some(pos) = i.links.iter().position(|l| l.p == parent && l.n == ename) {
                i.links.remove(pos);
                i.nlink = if i.kind == Kind::Dir {
                    0
                } else {
                    i.nlink.saturating_sub(1)
                };
                i.ctime_ns = now;
                i.orphan = i.nlink == 0
                    && if i.kind == Kind::Dir {
                        referenced
                    } else {
                        keep_file
                    };
            }
            // The last name of an unused inode: delete the document at once
            // (writing its zero link count first would be a wasted write).
            if i.nlink == 0 && !i.orphan {
                // Removing contents twice (a retry) is harmless.
                self.remove_contents(i)?;
                return Ok(Fate::Delete);
            }
            Ok(Fate::Keep)
        })?;
        match fate {
            Fate::Delete => {
                self.forget_inode_state(ino);
                Ok(())
            }
            Fate::Keep => self.sync_entries(&i),
        }
    }

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
            let (peek, _) = self.get_entry(parent, name)?.ok_or(FsError::NotFound)?;
            let peek_dst = self.get_entry(newparent, newname)?;
            let moves_dir = |s: &Entry, d: &Option<(Entry, Version)>| {
                s.kind == Kind::Dir
                    || (exchange && d.as_ref().is_some_and(|(d, _)| d.kind == Kind::Dir))
            };
            let whole_tree = moves_dir(&peek, &peek_dst);
            let _g = if whole_tree {
                self.locks.exclusive()
            } else {
                self.locks.dirs(&[parent, newparent])
            };
            // Across mounts: the guide's tree lock, exclusive on both names.
            let (_t, _) = self.tree_lock(
                &[parent, newparent],
                &[(parent, &peek.name), (newparent, &new_ename)],
            )?;
            let (src, sver) = self.get_entry(parent, name)?.ok_or(FsError::NotFound)?;
            let dst = self.get_entry(newparent, newname)?;
            if moves_dir(&src, &dst) && !whole_tree {
                continue; // changed under us: retry with the tree lock
            }
            return if exchange {
                let (dst, dver) = dst.ok_or(FsError::NotFound)?;
                self.exchange(src, sver, dst, dver)
            } else {
                self.move_entry(src, sver, newparent, newname, new_ename, dst, flags)
            };
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn move_entry(
        &self,
        src: Entry,
        sver: Version,
        newparent: u64,
        newname: &[u8],
        new_ename: String,
        dst: Option<(Entry, Version)>,
        flags: u32,
    ) -> FsResult<()> {
        let src_is_dir = src.kind == Kind::Dir;
        let mut replaced_dir = false;
        if let Some((d, _)) = &dst {
            if d.ino == src.ino {
                return Ok(()); // two names of one file: POSIX says do nothing
            }
            if flags & RENAME_NOREPLACE != 0 {
                return Err(FsError::Exists);
            }
            match (src_is_dir, d.kind == Kind::Dir) {
                (true, false) => return Err(FsError::NotDir),
                (false, true) => return Err(FsError::IsDir),
                (true, true) => {
                    if !self.dir_is_empty(d.ino)? {
                        return Err(FsError::NotEmpty);
                    }
                    replaced_dir = true;
                }
                (false, false) => {}
            }
        }
        let (npinode, _) = self.get_inode(newparent)?;
        if npinode.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if src_is_dir && self.is_ancestor(src.ino, newparent)? {
            return Err(FsError::Invalid);
        }
        let new_dir = self.dir_path(newparent)?;
        let moved = Entry {
            parent: newparent,
            name: new_ename.clone(),
            path: join_path(&new_dir, &new_ename),
            dir: new_dir,
            cookie: self.alloc()?,
            ..src.clone()
        };
        if !src_is_dir && dst.is_none() && self.move_file_at_once(&src, sver, &moved)? {
            self.touch_dir(src.parent, 0)?;
            if newparent != src.parent {
                self.touch_dir(newparent, 0)?;
            }
            return Ok(());
        }
        let intent = recovery::MoveIntent {
            src_parent: src.parent,
            src_name: src.name.clone(),
            old_path: src.path.clone(),
            entry: moved,
            replaced: dst.as_ref().map(|(d, _)| d.ino),
        };
        // The intent goes first: if this mount dies from here on, whoever
        // notices rolls the rename forward from it.
        let iid = self.write_intent(&recovery::Intent::Move(intent.clone()))?;
        // The usual case in one bulk (atomic on the embedded store); the
        // intent's idempotent steps redo whatever a crash left undone.
        let new_id = entry_id(newparent, newname);
        let put_new = match &dst {
            Some((_, dver)) => BulkOp::Index {
                index: Idx::Entries,
                id: new_id,
                source: to_doc(&intent.entry),
                if_version: Some(*dver),
            },
            None => BulkOp::Create {
                index: Idx::Entries,
                id: new_id,
                source: to_doc(&intent.entry),
            },
        };
        let old_id = entry_id(src.parent, &decode_bytes(&src.name));
        let res = self.store.bulk(vec![
            put_new,
            BulkOp::Delete {
                index: Idx::Entries,
                id: old_id,
                if_version: Some(sver),
            },
        ])?;
        // Nothing of the rename happened if the first item failed; a
        // half-done state (second failed) is completed by the steps.
        let entries_done = match bulk_check(res) {
            Ok(()) => true,
            Err(e) => {
                log::debug!("rename bulk: {e}; completed by steps");
                false
            }
        };
        self.apply_move(&intent, false, entries_done)?;
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
        self.touch_dir(src.parent, dir_delta(src.parent))?;
        if newparent != src.parent {
            self.touch_dir(newparent, dir_delta(newparent))?;
        }
        self.finish_intent(&iid)
    }

    /// A file renamed to a free name, on a store that applies a bulk all or
    /// nothing (the embedded one: one transaction, one redo record): both
    /// entries and the inode's back-link in one bulk, which no crash can
    /// split, so no intent is written and deleted (a sixth of a rename's
    /// cost). False: not done (no such store, or a concurrent change to
    /// the entry or inode): the intent's way does it.
    fn move_file_at_once(&self, src: &Entry, sver: Version, moved: &Entry) -> FsResult<bool> {
        // Only the embedded store (this mount its sole writer) offers it;
        // elsewhere the inode read below would be wasted.
        if !self.cfg.exclusive {
            return Ok(false);
        }
        let (mut inode, iver) = self.get_inode(src.ino)?;
        relink(&mut inode, src.parent, &src.name, moved.parent, &moved.name);
        inode.ctime_ns = now_ns();
        let ops = vec![
            BulkOp::Create {
                index: Idx::Entries,
                id: entry_id(moved.parent, &decode_bytes(&moved.name)),
                source: to_doc(moved),
            },
            BulkOp::Delete {
                index: Idx::Entries,
                id: entry_id(src.parent, &decode_bytes(&src.name)),
                if_version: Some(sver),
            },
            BulkOp::Index {
                index: Idx::Inodes,
                id: inode_id(src.ino),
                source: to_doc(&inode),
                if_version: Some(iver),
            },
        ];
        Ok(self
            .store
            .bulk_atomic(ops)?
            .is_some_and(|results| results.iter().all(|r| r.is_ok())))
    }

    /// RENAME_EXCHANGE: the two names swap the inodes they point to.
    fn exchange(&self, a: Entry, aver: Version, b: Entry, bver: Version) -> FsResult<()> {
        if a.ino == b.ino {
            return Ok(());
        }
        if (a.kind == Kind::Dir && self.is_ancestor(a.ino, b.parent)?)
            || (b.kind == Kind::Dir && self.is_ancestor(b.ino, a.parent)?)
        {
            return Err(FsError::Invalid);
        }
        // Each position keeps its name, path and cookie and takes the other's inode.
        let swap = |pos: &Entry, from: &Entry| {
            let mut e = pos.clone();
            e.take_inode_fields(from);
            e
        };
        let (new_a, new_b) = (swap(&a, &b), swap(&b, &a));
        let iid = self.write_intent(&recovery::Intent::Exchange {
            a: a.clone(),
            b: b.clone(),
        })?;
        let ops = [(&a, &new_a, aver), (&b, &new_b, bver)]
            .into_iter()
            .map(|(pos, new, ver)| BulkOp::Index {
                index: Idx::Entries,
                id: entry_id(pos.parent, &decode_bytes(&pos.name)),
                source: to_doc(new),
                if_version: Some(ver),
            })
            .collect();
        if let Err(e) = bulk_check(self.store.bulk(ops)?) {
            // A concurrent refresh of either entry (the content indexer):
            // the intent's idempotent steps finish the exchange.
            log::debug!("exchange bulk: {e}; completed by steps");
            self.apply_exchange(&a, &b)?;
            return self.finish_intent(&iid);
        }
        let now = now_ns();
        for (moved, from, to) in [(&a, &a, &b), (&b, &b, &a)] {
            self.update_inode(moved.ino, |i| {
                relink(i, from.parent, &from.name, to.parent, &to.name);
                i.ctime_ns = now;
                Ok(())
            })?;
            if moved.kind == Kind::Dir {
                self.dirs
                    .write()
                    .insert(moved.ino, (to.parent, to.name.clone()));
            }
        }
        if a.parent != b.parent && (a.kind == Kind::Dir) != (b.kind == Kind::Dir) {
            let d = if a.kind == Kind::Dir { 1 } else { -1 };
            self.touch_dir(a.parent, -d)?;
            self.touch_dir(b.parent, d)?;
        } else {
            self.touch_dir(a.parent, 0)?;
            if a.parent != b.parent {
                self.touch_dir(b.parent, 0)?;
            }
        }
        match (a.kind == Kind::Dir, b.kind == Kind::Dir) {
            (true, true) => {
                // Swap through a path no real document can have.
                let tmp = format!("/\0swap{}", self.alloc()?);
                self.rewrite_subtree(&a.path, &tmp)?;
                self.rewrite_subtree(&b.path, &a.path)?;
                self.rewrite_subtree(&tmp, &b.path)?;
            }
            (true, false) => self.rewrite_subtree(&a.path, &b.path)?,
            (false, true) => self.rewrite_subtree(&b.path, &a.path)?,
            (false, false) => {}
        }
        self.finish_intent(&iid)
    }

    /// Whether directory `dir` is `ino` or one of its ancestors is.
    fn is_ancestor(&self, ino: u64, dir: u64) -> FsResult<bool> {
        Ok(dir == ino || self.ancestors(dir)?.iter().any(|(a, _)| *a == ino))
    }

    /// The seeds' directory rename: find every document strictly below `old`
    /// (one `path.tree` term) and bulk-update its `path` and `dir` to be below
    /// `new`, page by page, checking every item. A backend that can rewrite
    /// the subtree itself (the embedded store: one SQL statement) does so.
    pub(super) fn rewrite_subtree(&self, old: &str, new: &str) -> FsResult<()> {
        self.see_other_mounts()?;
        // A backend that rewrites the subtree itself does it in one request.
        if self.store.rebase_paths(Idx::Entries, old, new)?.is_some() {
            return Ok(());
        }
        let query = Query::Bool {
            must: vec![Query::tree("path", old)],
            must_not: vec![Query::term("path", old)],
            should: vec![],
        };
        let rebase = |p: &str| format!("{new}{}", &p[old.len()..]);
        // Partial updates of `path` and `dir` only: the documents' other
        // fields (file text above all) are neither read nor rewritten.
        let moved = |src: &Value| -> StoreResult<Value> {
            let field = |k: &str| {
                src[k]
                    .as_str()
                    .filter(|p| p.starts_with(old))
                    .map(rebase)
                    .ok_or_else(|| {
                        StoreError::Other(format!("entry without {k} below {old}: {src}"))
                    })
            };
            Ok(json!({"path": field("path")?, "dir": field("dir")?}))
        };
        let mut retry: Vec<String> = Vec::new();
        crate::store::scan_brief(
            &*self.store,
            Idx::Entries,
            query,
            // Paths are unique, and this order is served by the path index
            // (a second key would force a sort of the whole subtree per page).
            vec![crate::store::Sort::asc("path")],
            1000,
            |hits| {
                let mut ops = Vec::with_capacity(hits.len());
                for h in hits {
                    ops.push(BulkOp::Update {
                        index: Idx::Entries,
                        doc: moved(&h.doc.source)?,
                        id: h.doc.id,
                        if_version: Some(h.doc.version),
                    });
                }
                let results = self.store.bulk(ops.clone())?;
                for (op, r) in ops.into_iter().zip(results) {
                    match r {
                        Ok(_) | Err(StoreError::NotFound(_)) => {}
                        // Changed concurrently (an attribute refresh): redo alone.
                        Err(StoreError::Conflict(_)) => retry.push(op.id().to_string()),
                        Err(e) => return Err(e),
                    }
                }
                Ok(true)
            },
        )?;
        for id in retry {
            for attempt in 0.. {
                let Some(doc) = self.store.get_brief(Idx::Entries, &id)? else {
                    break;
                };
                let path = doc.source["path"].as_str().unwrap_or_default();
                if !(path.starts_with(old) && path.as_bytes().get(old.len()) == Some(&b'/')) {
                    break;
                }
                let r = self.store.bulk(vec![BulkOp::Update {
                    index: Idx::Entries,
                    id: id.clone(),
                    doc: moved(&doc.source)?,
                    if_version: Some(doc.version),
                }])?;
                match r.into_iter().next().expect("one result") {
                    Ok(_) | Err(StoreError::NotFound(_)) => break,
                    Err(StoreError::Conflict(_)) if attempt < MAX_RETRIES => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }
}

/// Replace the back-link (from_p, from_n) of an inode with (to_p, to_n).
/// Idempotent: running it again (crash recovery) changes nothing.
pub(super) fn relink(i: &mut Inode, from_p: u64, from_n: &str, to_p: u64, to_n: &str) {
    let to = Link {
        p: to_p,
        n: to_n.to_string(),
    };
    let from = i.links.iter().position(|l| l.p == from_p && l.n == from_n);
    let has_to = i.links.contains(&to);
    match (from, has_to) {
        (Some(pos), false) => i.links[pos] = to,
        (Some(pos), true) => {
            i.links.remove(pos);
        }
        (None, false) => i.links.push(to),
        (None, true) => {}
    }
}
