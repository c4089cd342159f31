//! Names going away: unlink and rmdir, and the kernel's references
//! (lookups and forgets) that keep an unlinked inode alive until nothing
//! uses it (see [`crate::fs::files`] for what follows the last).

use crate::error::{FsError, FsResult};
use crate::fs::docs::MAX_RETRIES;
use crate::fs::{Fs, encode_name};
use crate::model::{Kind, entry_id};
use crate::store::{BulkItemResult, BulkOp, Idx, MetaStore, StoreError, Version};

impl Fs {
    pub fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        encode_name(name)?;
        let _g = self.tree.lock_dirs(&[parent]);
        // Lock, then look once: what another mount changed before is seen
        // (a lock taken for a name that turns out missing costs nothing:
        // the parent's shared lock is usually held already).
        let (_t, _) = self.tree.lock(&[parent], &[])?;
        // A cached entry is checked by the conditional delete; if the name
        // names another inode by now, look again in the store.
        let mut fresh = false;
        loop {
            let (entry, ver) = match fresh {
                false => self.docs.entry_brief(parent, name)?,
                true => self.docs.entry_fresh(parent, name)?,
            }
            .ok_or(FsError::NotFound)?;
            if entry.kind == Kind::Dir {
                return Err(FsError::IsDir);
            }
            // The parent's times go in the entry's bulk.
            let touch = self.tree.touch_op(parent, 0, None)?;
            let touched = match self.delete_entry(parent, name, entry.ino, ver, touch) {
                Err(FsError::Again) if !fresh => {
                    fresh = true;
                    continue;
                }
                r => r?,
            };
            self.files.drop_link(entry.ino, parent, &entry.name)?;
            return self.tree.touched(parent, 0, matches!(touched, Some(Ok(_))));
        }
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        if name == b"." {
            return Err(FsError::Invalid);
        }
        if name == b".." {
            return Err(FsError::NotEmpty);
        }
        encode_name(name)?;
        // The name as cached: the delete below is conditional on its
        // version, so a copy another mount overtook (the name removed,
        // renamed over, or naming a file now) changes nothing and is read
        // again from the store; so is one that would refuse.
        let mut fresh = false;
        loop {
            let (entry, ver) = match fresh {
                false => self.docs.entry_brief(parent, name)?,
                true => self.docs.entry_fresh(parent, name)?,
            }
            .ok_or(FsError::NotFound)?;
            if entry.kind != Kind::Dir {
                if fresh {
                    return Err(FsError::NotDir);
                }
                fresh = true;
                continue;
            }
            // Lock the parent and the directory itself (creates inside it
            // lock it), in a deadlock-free sorted order.
            let _g = self.tree.lock_dirs(&[parent, entry.ino]);
            // Exclusive on the directory itself: no other mount can create
            // in it (creates hold it shared) while we check it is empty.
            // The count needs no refresh for other mounts' names: a mount
            // makes what it wrote searchable before it gives up its share
            // (`MetaStore::publish`), and ours are read-your-writes.
            let (t, _) = self.tree.lock(&[parent], &[(parent, &entry.name)])?;
            if !self.tree.is_empty(entry.ino)? {
                return Err(FsError::NotEmpty);
            }
            match self.delete_entry(parent, name, entry.ino, ver, None) {
                Err(FsError::Again | FsError::NotFound) if !fresh => {
                    fresh = true;
                    continue;
                }
                r => r?,
            };
            // The parent's link count and times, and the directory's inode
            // kept as an orphan until the kernel forgets it, go in the
            // request that releases the locks (neither needs them: the
            // name is gone); what did not land is redone the re-reading way.
            let name = &entry.name;
            let Some(touch) = self.tree.touch_op(parent, -1, None)? else {
                self.files.drop_link(entry.ino, parent, name)?;
                drop(t);
                return self.tree.touch(parent, -1);
            };
            let orphan = self.files.drop_dir_link_op(entry.ino, parent, name)?;
            if orphan.is_none() {
                self.files.drop_link(entry.ino, parent, name)?;
            }
            let kept = orphan.is_some();
            let mut landed = t
                .release_with([touch].into_iter().chain(orphan).collect())?
                .into_iter()
                .map(|r| r.is_ok());
            let touched = landed.next() == Some(true);
            if kept {
                let orphaned = landed.next() == Some(true);
                self.files
                    .dir_link_dropped(entry.ino, parent, name, orphaned)?;
            }
            return self.tree.touched(parent, -1, touched);
        }
    }

    /// Delete the entry `name` in `parent` if it still names `ino`, in one
    /// bulk with `touch` (the parent's times, which may land even if the
    /// delete does not: a harmless time); returns `touch`'s result. A
    /// version conflict from an attribute refresh of the same entry (a
    /// close racing with the unlink) is retried; the entry naming another
    /// inode is not (EAGAIN).
    fn delete_entry(
        &self,
        parent: u64,
        name: &[u8],
        ino: u64,
        ver: Version,
        mut touch: Option<BulkOp>,
    ) -> FsResult<Option<BulkItemResult>> {
        let id = entry_id(parent, name);
        let mut ver = ver;
        let mut touched = None;
        for _ in 0..MAX_RETRIES {
            let mut ops = vec![BulkOp::Delete {
                index: Idx::Entries,
                id: id.clone(),
                if_version: Some(ver),
            }];
            ops.extend(touch.take());
            let mut results = self.store.bulk(ops)?.into_iter();
            let deleted = results.next().expect("one result per op");
            touched = touched.or(results.next());
            match deleted {
                Ok(_) => return Ok(touched),
                Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
            let Some((cur, v)) = self.docs.entry_brief(parent, name)? else {
                return Err(FsError::NotFound);
            };
            if cur.ino != ino {
                return Err(FsError::Again);
            }
            ver = v;
        }
        Err(FsError::Again)
    }

    /// The kernel now holds one more reference to `ino` (an entry reply).
    pub fn remember(&self, ino: u64) {
        self.files.remember(ino);
    }

    /// The kernel dropped `n` references; the last one of an unlinked inode
    /// that nothing has open deletes it.
    pub fn forget(&self, ino: u64, n: u64) {
        if !self.files.forget(ino, n) {
            return;
        }
        if self.pending.lazy() || self.files.unused_orphan(ino) {
            // Deleting an unlinked inode waits for the write-back, which
            // deletes many per transaction (lazy close), or the removed
            // directories of a second in one bulk (an rmdir's own lookup
            // is forgotten right after it: a request per rmdir otherwise).
            self.write_back.defer_forget(ino);
            return;
        }
        self.files.finish_forget(ino);
    }
}
