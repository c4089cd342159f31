//! Making a node: mknod, mkdir, symlink, and create(2), which opens the
//! file it made.
//!
//! A new inode document is written with the entry that names it, in one
//! bulk; a crash between them leaves at most an unreferenced inode, which
//! fsck reclaims.

use crate::error::{FsError, FsResult};
use crate::fs::docs::to_doc;
use crate::fs::{Ctx, Fs, NewNode, encode_name};
use crate::model::{
    Entry, Inode, Kind, Link, decode_bytes, encode_bytes, entry_id, inode_id, now_ns,
};
use crate::store::{BulkItemResult, BulkOp, Idx, MetaStore, StoreError};

impl Fs {
    /// create(2): make the file and open it in one step.
    pub fn create(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> FsResult<(Inode, u64)> {
        let inode = self.make_node(ctx, parent, name, NewNode::File, mode, umask)?;
        let fh = self.files.register(&inode, None)?;
        Ok((inode, fh))
    }

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
        let _g = self.tree.lock_dirs(&[parent]);
        // Lock first, then look: an rmdir (exclusive on the directory) by
        // another mount cannot slip in between the check and the create.
        let (_t, paths) = self.tree.lock(&[parent], &[])?;
        let dir = paths[0].clone();
        let (pinode, pver) = self.docs.inode(parent)?;
        if pinode.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if pinode.nlink == 0 {
            return Err(FsError::NotFound); // removed while we looked
        }
        // No look for the name first: the entry's create is put-if-absent,
        // and an existing name fails it (EEXIST below), which a read
        // before would only repeat.
        let (ino, cookie) = (self.ids.alloc()?, self.ids.alloc()?);
        let (kind, rdev, target) = match node {
            NewNode::File => (Kind::File, 0, None),
            NewNode::Dir => (Kind::Dir, 0, None),
            NewNode::Symlink(t) => (Kind::Symlink, 0, Some(encode_bytes(t))),
            NewNode::Special(k, rdev) => (k, rdev, None),
        };
        let (mode, gid) = mode_and_group(kind, mode, umask, ctx, &pinode);
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
            map: None,
        };
        let entry = Entry::new(parent, &ename, dir, &inode, cookie);
        let eid = entry_id(parent, name);
        // The parent's times (and a new directory's ".." link) go in the
        // same bulk: one request per node made.
        let nlink = if kind == Kind::Dir { 1 } else { 0 };
        let touch = self
            .tree
            .touch_op(parent, nlink, Some((pinode.clone(), pver)))?;
        let mut ops = vec![
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
        ];
        let touching = touch.is_some();
        ops.extend(touch);
        let res = self.store.bulk(ops)?;
        let touched = res.get(2).filter(|_| touching);
        let ours = self.made_by_this_create(&res[0], &res[1], parent, name, ino)?;
        match (&res[0], &res[1]) {
            _ if ours => {}
            (ri, re) => {
                // Undo whichever half landed, and the parent's link count
                // (its times may stay moved: harmless).
                if ri.is_ok() {
                    let _ = self.store.delete(Idx::Inodes, &inode_id(ino), None);
                }
                if re.is_ok() {
                    let _ = self.store.delete(Idx::Entries, &eid, None);
                }
                if nlink != 0 && matches!(touched, Some(Ok(_))) {
                    self.tree.touch(parent, -nlink)?;
                }
                return Err(match re {
                    Err(StoreError::Conflict(_)) => FsError::Exists,
                    Err(e) => e.clone().into(),
                    Ok(_) => ri.clone().unwrap_err().into(),
                });
            }
        }
        if kind == Kind::Dir {
            self.tree.placed(ino, parent, &ename);
        }
        match touched {
            Some(r) => self.tree.touched(parent, nlink, r.is_ok())?,
            None => self.tree.touch_seen(parent, nlink, Some((pinode, pver)))?,
        }
        Ok(inode)
    }
}

impl Fs {
    /// Whether both documents of a create are this create's own, though one
    /// or both were answered as a conflict. The inode number is fresh, so it
    /// is the create's write id: a document already holding it can only be
    /// an earlier copy of this very write. Elasticsearch makes such copies
    /// itself: a primary that dies after replicating a bulk has it retried on
    /// the promoted replica, which answers 409 for what it just wrote (seen
    /// as `cp -a` failing with EEXIST while a node was killed).
    fn made_by_this_create(
        &self,
        inode: &BulkItemResult,
        entry: &BulkItemResult,
        parent: u64,
        name: &[u8],
        ino: u64,
    ) -> FsResult<bool> {
        let settled = |r: &BulkItemResult| r.is_ok() || matches!(r, Err(StoreError::Conflict(_)));
        if !settled(inode) || !settled(entry) {
            return Ok(false);
        }
        if entry.is_ok() {
            // The entry is new, so the fresh inode number it names is ours.
            return Ok(true);
        }
        // Ours if the name now names our inode; else the name was taken.
        Ok(self
            .docs
            .entry_fresh(parent, name)?
            .is_some_and(|(e, _)| e.ino == ino))
    }
}

/// A new node's mode (the umask applied; a symlink's is 0777) and group:
/// BSD group semantics in setgid directories (as ext4 does).
fn mode_and_group(kind: Kind, mode: u32, umask: u32, ctx: Ctx, parent: &Inode) -> (u32, u32) {
    let mut mode = match kind {
        Kind::Symlink => 0o777,
        _ => mode & 0o7777 & !umask,
    };
    let mut gid = ctx.gid;
    if parent.mode & libc::S_ISGID != 0 {
        gid = parent.gid;
        if kind == Kind::Dir {
            mode |= libc::S_ISGID;
        }
    }
    (mode, gid)
}
