//! Names and inodes going away: unlink, rmdir, the dropped link, and the
//! kernel's references (lookup counts and forgets) that keep an unlinked
//! inode alive until nothing uses it.

use crate::fs::*;
use crate::store::Query;

/// How many deleted inodes `Fs::gone` remembers: the race it closes lasts
/// one open(2), far shorter than this many deletions.
const GONE_MAX: usize = 1 << 16;

impl Fs {
    pub fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        encode_name(name)?;
        let _g = self.locks.dirs(&[parent]);
        // Lock, then look once: what another mount changed before is seen
        // (a lock taken for a name that turns out missing costs nothing:
        // the parent's shared lock is usually held already).
        let (_t, _) = self.tree_lock(&[parent], &[])?;
        // A cached entry is checked by the conditional delete; if the name
        // names another inode by now, look again in the store.
        let mut fresh = false;
        loop {
            let (entry, ver) = match fresh {
                false => self.docs.entry(parent, name)?,
                true => self.docs.entry_fresh(parent, name)?,
            }
            .ok_or(FsError::NotFound)?;
            if entry.kind == Kind::Dir {
                return Err(FsError::IsDir);
            }
            // The parent's times go in the entry's bulk.
            let touch = self.touch_op(parent, 0, None)?;
            let touched = match self.delete_entry(parent, name, entry.ino, ver, touch) {
                Err(FsError::Again) if !fresh => {
                    fresh = true;
                    continue;
                }
                r => r?,
            };
            self.drop_link(entry.ino, parent, &entry.name)?;
            return self.touched(parent, 0, matches!(touched, Some(Ok(_))));
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
        loop {
            // Lock the parent and the directory itself (creates inside it
            // lock it), in a deadlock-free sorted order, then re-check.
            let (peek, _) = self.docs.entry(parent, name)?.ok_or(FsError::NotFound)?;
            let _g = self.locks.dirs(&[parent, peek.ino]);
            // Exclusive on the directory itself: no other mount can create
            // in it (creates hold it shared) while we check it is empty.
            let (_t, _) = self.tree_lock(&[parent], &[(parent, &peek.name)])?;
            let (entry, ver) = self
                .docs
                .entry_fresh(parent, name)?
                .ok_or(FsError::NotFound)?;
            if entry.ino != peek.ino {
                continue;
            }
            if entry.kind != Kind::Dir {
                return Err(FsError::NotDir);
            }
            self.docs.see_other_mounts()?;
            if !self.dir_is_empty(entry.ino)? {
                return Err(FsError::NotEmpty);
            }
            self.delete_entry(parent, name, entry.ino, ver, None)?;
            self.drop_link(entry.ino, parent, &entry.name)?;
            return self.touch_dir(parent, -1);
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
    ) -> FsResult<Option<crate::store::BulkItemResult>> {
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
            let Some((cur, v)) = self.docs.entry(parent, name)? else {
                return Err(FsError::NotFound);
            };
            if cur.ino != ino {
                return Err(FsError::Again);
            }
            ver = v;
        }
        Err(FsError::Again)
    }

    pub(in crate::fs) fn dir_is_empty(&self, ino: u64) -> FsResult<bool> {
        Ok(self
            .store
            .count(Idx::Entries, &Query::term("parent", ino))?
            == 0)
    }

    /// One name of `ino` is gone: drop the link; at zero links delete the
    /// inode, unless it is still in use (then the last close or forget does).
    pub(in crate::fs) fn drop_link(&self, ino: u64, parent: u64, ename: &str) -> FsResult<()> {
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
            let dying = !open && !self.caps.single_writer;
            if dying {
                self.dying.lock().insert(ino);
            }
            (open, dying)
        };
        let r = self.drop_link_marked(ino, parent, ename, open, now);
        if dying {
            // Under the open lock, as the mark was made: an open that read
            // the inode before its deletion sees it in `gone` instead.
            let _states = self.open.lock();
            if matches!(r, Ok(Fate::Delete { .. })) {
                let mut gone = self.gone.lock();
                if gone.0.len() >= GONE_MAX
                    && let Some(old) = gone.0.pop_front()
                {
                    gone.1.remove(&old);
                }
                gone.0.push_back(ino);
                gone.1.insert(ino);
            }
            self.dying.lock().remove(&ino);
        }
        r.map(drop)
    }

    fn drop_link_marked(
        &self,
        ino: u64,
        parent: u64,
        ename: &str,
        open: bool,
        now: i64,
    ) -> FsResult<Fate> {
        let referenced = open || self.lookups.lock().contains_key(&ino);
        let keep_file = if self.caps.single_writer {
            referenced
        } else {
            open
        };
        // Known before the write, so a release or forget racing it reads
        // the inode again.
        if referenced {
            self.orphans.lock().insert(ino);
        }
        let (i, fate) = self.docs.change(ino, |i| {
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
                // Its contents go with it (see `Docs::delete_inode`).
                return Ok(Fate::Delete {
                    open_size: self.open_size(ino),
                });
            }
            Ok(Fate::Keep)
        })?;
        if matches!(fate, Fate::Delete { .. }) || !i.orphan {
            self.orphans.lock().remove(&ino);
        }
        match fate {
            Fate::Delete { .. } => self.forget_inode_state(ino),
            Fate::Keep => self.docs.sync_entries(&i)?,
        }
        Ok(fate)
    }

    /// The kernel now holds one more reference to `ino` (an entry reply).
    pub fn remember(&self, ino: u64) {
        *self.lookups.lock().entry(ino).or_insert(0) += 1;
    }

    /// The kernel dropped `n` references; the last one of an unlinked inode
    /// that nothing has open deletes it.
    pub fn forget(&self, ino: u64, n: u64) {
        {
            let mut l = self.lookups.lock();
            match l.get_mut(&ino) {
                Some(c) if *c > n => {
                    *c -= n;
                    return;
                }
                Some(_) => {
                    l.remove(&ino);
                }
                None => return,
            }
        }
        if self.lazy_close() {
            // Deleting an unlinked inode (marked orphan by its unlink, so a
            // crash before this loses nothing: the next mount reclaims it)
            // waits for the write-back, which deletes many per transaction.
            self.forgotten.lock().push(ino);
            return;
        }
        self.finish_forget(ino);
    }

    /// The kernel holds no reference to `ino` any more (unless it looked it
    /// up again since): persist and drop its state, delete it if unlinked.
    pub(in crate::fs) fn finish_forget(&self, ino: u64) {
        if self.lookups.lock().contains_key(&ino) {
            return; // looked up again; a later forget comes back here
        }
        let handles = self.open.lock().get(&ino).map(|st| st.open_handles());
        match handles {
            Some(n) if n > 0 => return, // the last release decides
            Some(_) => {
                // No-open mode: no descriptor holds the inode any more.
                if let Err(e) = self.persist(ino).and_then(|()| self.drop_state(ino)) {
                    log::error!("forget {ino}: {e}");
                }
                return;
            }
            None => {}
        }
        if !self.orphans.lock().contains(&ino) {
            return;
        }
        match self.docs.inode(ino) {
            Ok((inode, _)) if inode.nlink == 0 => {
                if let Err(e) = self.destroy_inode(&inode) {
                    log::error!("deleting unlinked inode {ino}: {e}");
                }
            }
            Ok(_) | Err(FsError::NotFound) => {}
            Err(e) => log::error!("forget {ino}: {e}"),
        }
    }

    /// Unlinked inodes the kernel let go of that the write-back has yet to
    /// delete (see `forget`): how many, and their blocks.
    pub(in crate::fs) fn pending_deletions(&self) -> (u64, u64) {
        let inos = self.forgotten.lock().clone();
        let (mut n, mut blocks) = (0, 0);
        for ino in inos {
            let open = self.open.lock().get(&ino).map(|st| st.open_handles());
            if open.is_some_and(|h| h > 0) || self.lookups.lock().contains_key(&ino) {
                continue;
            }
            if let Ok((inode, _)) = self.docs.inode(ino)
                && inode.nlink == 0
            {
                n += 1;
                blocks += inode.size.div_ceil(BLOCK_SIZE);
            }
        }
        (n, blocks)
    }

    /// Whether the kernel or an open handle still references `ino`.
    pub(in crate::fs) fn in_use(&self, ino: u64) -> bool {
        self.is_open(ino) || self.lookups.lock().contains_key(&ino)
    }
}
