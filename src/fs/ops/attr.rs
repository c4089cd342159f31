//! Attribute calls: getattr, setattr, access, readlink, statfs, lookup.

use crate::fs::*;

/// Files up to this size are read with their inode by a lookup.
const PREFETCH_MAX: u64 = 16 << 10;

impl Fs {
    /// The inode as callers should see it: stored attributes plus the
    /// not-yet-persisted size/times of open files.
    pub fn getattr(&self, ino: u64) -> FsResult<Inode> {
        loop {
            let mark = self.settle_mark(ino);
            let (mut inode, _) = self.get_inode(ino).map_err(stale)?;
            if self.overlay(&mut inode, mark) {
                return Ok(inode);
            }
        }
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        if name.len() > NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        // Brief: a lookup needs the inode number, not the file's indexed text.
        let doc = self
            .store
            .get_brief(Idx::Entries, &entry_id(parent, name))?
            .ok_or(FsError::NotFound)?;
        let entry: Entry = serde_json::from_value(doc.source)?;
        if entry.kind == Kind::File && (1..=PREFETCH_MAX).contains(&entry.size) {
            self.prefetch(entry.ino);
        }
        self.getattr(entry.ino)
    }

    /// A small file's inode and first bytes in one round trip, when the
    /// store would read each on its own (a name another mount made): the
    /// open and read that usually follow a lookup then cost nothing. The
    /// entry's size copy picks the files; the inode read with the bytes
    /// decides whether they serve (see `DataStore::offer`). Best effort:
    /// a failure here is the getattr's to report.
    fn prefetch(&self, ino: u64) {
        let id = inode_id(ino);
        let key = ino.to_string(); // a file's content key (see make_node)
        if self.store.holds(Idx::Inodes, &id) {
            return;
        }
        let Some(piece) = self.data.first_piece(&key) else {
            return;
        };
        let keys = [(Idx::Inodes, id), (piece.index, piece.id.clone())];
        let Ok(docs) = self.store.mget_docs(&keys) else {
            return;
        };
        let Some(doc) = &docs[0] else { return };
        let Ok(inode) = serde_json::from_value::<Inode>(doc.source.clone()) else {
            return;
        };
        if inode.content.as_deref() == Some(key.as_str()) {
            self.data
                .offer(&key, piece, docs[1].as_ref(), inode.size, doc.version);
        }
    }

    pub fn setattr(&self, ctx: Ctx, ino: u64, set: SetAttr) -> FsResult<Inode> {
        let _ = ctx; // ownership rules are enforced by the kernel (default_permissions)
        if let Some(inode) = self.set_times_in_memory(ino, &set)? {
            return Ok(inode);
        }
        // Persist pending writes first so they cannot overwrite what we set.
        self.persist(ino)?;
        let now = now_ns();
        if let Some(size) = set.size {
            let (inode, _) = self.get_inode(ino)?;
            match inode.kind {
                Kind::File => {}
                Kind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid),
            }
            if let Some(key) = &inode.content {
                self.data.truncate(key, size)?;
            }
        }
        // A pending atime goes in with this write, unless this sets atime.
        let pending = self.atimes.lock().remove(&ino);
        let inode = self.update_inode(ino, |i| {
            if let Some(m) = set.mode {
                i.mode = m & 0o7777;
            }
            if let Some(u) = set.uid {
                i.uid = u;
            }
            if let Some(g) = set.gid {
                i.gid = g;
            }
            if let Some(s) = set.size {
                i.size = s;
                i.mtime_ns = now;
                if let Some(k) = &i.content {
                    i.stored = self.data.stored_bytes(k, i.stored)?.or(i.stored);
                }
            }
            match (set.atime, pending) {
                (Some(TimeSpec::Now), _) => i.atime_ns = now,
                (Some(TimeSpec::At(t)), _) => i.atime_ns = t,
                (None, Some(a)) => i.atime_ns = i.atime_ns.max(a),
                (None, None) => {}
            }
            match set.mtime {
                Some(TimeSpec::Now) => i.mtime_ns = now,
                Some(TimeSpec::At(t)) => i.mtime_ns = t,
                None => {}
            }
            i.ctime_ns = set.ctime.unwrap_or(now);
            Ok(())
        })?;
        self.refresh_open(&inode);
        if let (Some(_), Some(key), true) = (
            &self.journal,
            &inode.content,
            set.size.is_some() || set.mtime.is_some(),
        ) {
            // Keep the data's mtime the file's (see `replay_journal`).
            self.data.set_mtime(key, inode.mtime_ns)?;
        }
        self.sync_entries(&inode)?;
        if (set.size.is_some() || set.mtime.is_some()) && inode.kind == Kind::File {
            self.content_changed(ino);
        }
        Ok(inode)
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let (inode, _) = self.get_inode(ino)?;
        match (&inode.kind, &inode.target) {
            (Kind::Symlink, Some(t)) => Ok(decode_bytes(t)),
            _ => Err(FsError::Invalid),
        }
    }

    pub fn statfs(&self) -> FsResult<StatFs> {
        // Removed files count as freed at once, as df expects, but their
        // deletion stays with the write-back: deleting a big file's
        // contents can take a tenth of a second, and tools call statfs
        // while they work (grep -r and find do, once per tree).
        let cap = self.data.capacity()?;
        // Counted before the pending deletions: one the write-back does
        // in between then shows as used for a moment, never as freed twice.
        let stored = self
            .store
            .count(Idx::Inodes, &crate::store::Query::MatchAll)?;
        let (pending, pending_blocks) = self.pending_deletions();
        let used = stored.saturating_sub(pending);
        Ok(StatFs {
            blocks: cap.total_bytes / BLOCK_SIZE,
            bfree: cap.free_bytes / BLOCK_SIZE + pending_blocks,
            bavail: cap.avail_bytes / BLOCK_SIZE + pending_blocks,
            files: used + cap.free_files,
            ffree: cap.free_files,
            bsize: BLOCK_SIZE as u32,
            namelen: NAME_MAX as u32,
        })
    }

    /// access(2) for callers that ask (the kernel checks opens itself).
    pub fn access(&self, ctx: Ctx, ino: u64, mask: i32) -> FsResult<()> {
        let inode = self.getattr(ino)?;
        if mask == libc::F_OK {
            return Ok(());
        }
        let bits = if ctx.uid == 0 {
            // root may read/write anything; execute needs some x bit on files
            let x = inode.kind == Kind::Dir || inode.mode & 0o111 != 0;
            0o6 | if x { 0o1 } else { 0 }
        } else if ctx.uid == inode.uid {
            (inode.mode >> 6) & 7
        } else if in_group(ctx, inode.gid) {
            (inode.mode >> 3) & 7
        } else {
            inode.mode & 7
        };
        if (mask as u32) & !bits & 7 != 0 {
            return Err(FsError::Access);
        }
        Ok(())
    }
}
