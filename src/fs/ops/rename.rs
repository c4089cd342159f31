//! rename(2) and renameat2(2): the fast paths of a move and an exchange.
//!
//! A rename writes an intent first (see [`crate::fs::intent`]), then does
//! the change, then deletes the intent: a crash in between is rolled
//! forward by whoever notices. The new entry is written before the old one
//! goes, so a crash leaves the file reachable.

use crate::fs::intent::{Intent, MoveIntent};
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
            // Fresh: an intent is written from these.
            let (src, sver) = self
                .get_entry_fresh(parent, name)?
                .ok_or(FsError::NotFound)?;
            let dst = self.get_entry_fresh(newparent, newname)?;
            if moves_dir(&src, &dst) && !whole_tree {
                continue; // changed under us: retry with the tree lock
            }
            return if exchange {
                let (dst, dver) = dst.ok_or(FsError::NotFound)?;
                self.exchange(src, sver, dst, dver)
            } else {
                self.move_entry(src, sver, newparent, new_ename, dst, flags)
            };
        }
    }

    fn move_entry(
        &self,
        src: Entry,
        sver: Version,
        newparent: u64,
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
        let intent = MoveIntent {
            src_parent: src.parent,
            src_name: src.name.clone(),
            old_path: src.path.clone(),
            entry: moved,
            replaced: dst.as_ref().map(|(d, _)| d.ino),
        };
        if !src_is_dir && dst.is_none() && self.move_at_once(&intent, sver)? {
            self.touch_dir(src.parent, 0)?;
            if newparent != src.parent {
                self.touch_dir(newparent, 0)?;
            }
            return Ok(());
        }
        // The intent goes first: if this mount dies from here on, whoever
        // notices rolls the rename forward from it.
        let iid = self.write_intent(&Intent::Move(intent.clone()))?;
        self.apply_move(&intent, Some((sver, dst.as_ref().map(|(_, v)| *v))))?;
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
        let iid = self.write_intent(&Intent::Exchange {
            a: a.clone(),
            b: b.clone(),
        })?;
        if self.apply_exchange(&a, &b, Some((aver, bver)))? {
            // Directory link counts: a directory's ".." changes parents.
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
        }
        self.finish_intent(&iid)
    }

    /// Whether directory `dir` is `ino` or one of its ancestors is.
    fn is_ancestor(&self, ino: u64, dir: u64) -> FsResult<bool> {
        Ok(dir == ino || self.ancestors(dir)?.iter().any(|(a, _)| *a == ino))
    }
}
