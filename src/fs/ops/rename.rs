//! rename(2) and renameat2(2): the fast paths of a move and an exchange.
//!
//! A rename writes an intent first (see [`crate::fs::intent`]), then does
//! the change, then deletes the intent: a crash in between is rolled
//! forward by whoever notices. The new entry is written before the old one
//! goes, so a crash leaves the file reachable.

use crate::fs::intent::{self, relink};
use crate::fs::*;

pub const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
pub const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;

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
        let intent = intent::MoveIntent {
            src_parent: src.parent,
            src_name: src.name.clone(),
            old_path: src.path.clone(),
            entry: moved,
            replaced: dst.as_ref().map(|(d, _)| d.ino),
        };
        // The intent goes first: if this mount dies from here on, whoever
        // notices rolls the rename forward from it.
        let iid = self.write_intent(&intent::Intent::Move(intent.clone()))?;
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
        let iid = self.write_intent(&intent::Intent::Exchange {
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
}
