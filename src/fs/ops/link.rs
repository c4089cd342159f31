//! link(2): another name for an existing inode.

use crate::error::{FsError, FsResult};
use crate::fs::docs::to_doc;
use crate::fs::{Fs, encode_name};
use crate::model::{Entry, Inode, Kind, Link, entry_id, now_ns};
use crate::store::{Idx, MetaStore, StoreError};

impl Fs {
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> FsResult<Inode> {
        let ename = encode_name(newname)?;
        let _g = self.tree.lock_dirs(&[newparent]);
        let (_t, paths) = self.tree.lock(&[newparent], &[])?;
        let dir = paths[0].clone();
        let (target, _) = self.docs.inode(ino)?;
        if target.kind == Kind::Dir {
            return Err(FsError::NotPermitted);
        }
        if target.nlink == 0 {
            return Err(FsError::NotFound);
        }
        let (pinode, _) = self.docs.inode(newparent)?;
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
        let entry = Entry::new(newparent, &ename, dir, &target, self.ids.alloc()?);
        match self
            .store
            .create(Idx::Entries, &entry_id(newparent, newname), &to_doc(&entry))
        {
            Ok(_) => {}
            Err(StoreError::Conflict(_)) => return Err(FsError::Exists),
            Err(e) => return Err(e.into()),
        }
        let now = now_ns();
        let mark = self.files.settle_mark(ino);
        let inode = self.docs.update(ino, |i| {
            i.nlink += 1;
            i.ctime_ns = now;
            i.links.push(Link {
                p: newparent,
                n: ename.clone(),
            });
            Ok(())
        })?;
        self.tree.touch(newparent, 0)?;
        // The new name's entry gets the indexed text too.
        self.hook.changed(ino);
        let mut inode = inode;
        if !self.files.overlay(&mut inode, mark) {
            inode = self.files.attr(ino)?;
        }
        Ok(inode)
    }
}
