//! Attribute calls: getattr, setattr (and fallocate, which at most extends
//! the size), access, readlink, statfs, lookup.

use crate::data::Piece;
use crate::error::{FsError, FsResult};
use crate::fs::{BLOCK_SIZE, Ctx, Fs, SetAttr, StatFs, TimeSpec, in_group};
use crate::model::{Entry, Inode, Kind, NAME_MAX, decode_bytes, entry_id, inode_id, now_ns};
use crate::store::{Caller, Doc, Idx, MetaStore};

/// Files up to this size are read with their inode by a lookup.
const PREFETCH_MAX: u64 = 16 << 10;
/// Files per read-ahead hint at most: the data store keeps 256 offered
/// pieces, and a hint's must last until grep opens its files.
const READ_AHEAD_MAX: usize = 128;

impl Fs {
    /// The inode as callers should see it: stored attributes plus the
    /// not-yet-persisted size/times of open files.
    pub fn getattr(&self, ino: u64) -> FsResult<Inode> {
        self.files.attr(ino)
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        if name.len() > NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        let id = entry_id(parent, name);
        // A name seen before, its copy expired: read again along with its
        // inode (and a small file's first bytes) in one request.
        if let Some(old) = self.docs.stale_entry(parent, name) {
            let (mut keys, piece) = self.along(&old);
            keys.insert(0, (Idx::Entries, id));
            // Brief: a lookup needs the inode number, not the indexed text.
            let docs = self.store.mget_docs(&keys, true)?;
            let doc = docs[0].clone().ok_or(FsError::NotFound)?;
            let entry: Entry = doc.parse()?;
            if entry.ino == old.ino {
                self.offer_piece(entry.ino, piece, &docs[1..]);
            }
            return self.getattr(entry.ino);
        }
        let doc = self
            .store
            .get_brief(Idx::Entries, &id)?
            .ok_or(FsError::NotFound)?;
        let entry: Entry = doc.parse()?;
        // A small file (another mount's, as the inode is not cached): its
        // inode and first bytes in one request, so the open and read that
        // usually follow cost nothing. Best effort: the getattr reports.
        let (keys, piece) = self.along(&entry);
        if piece.is_some()
            && let Ok(docs) = self.store.mget_docs(&keys, true)
        {
            self.offer_piece(entry.ino, piece, &docs);
        }
        self.getattr(entry.ino)
    }

    /// `esfs search` is about to run grep over these files through the
    /// mount (`hint`: a JSON array of `[entry id, inode, size]`, as the
    /// index has them; see [`crate::hook::READ_AHEAD_XATTR`]): their
    /// entries, inodes and small files' first bytes in one request, so the
    /// lookups, opens and reads that follow are answered from memory. Cold,
    /// those cost a request or two each, and a miss reads the file's whole
    /// directory (two more), for one candidate in a hundred names.
    ///
    /// A hint, never trusted: the entries and inodes are the cluster's
    /// (realtime reads, cached as any read is), and the bytes serve only an
    /// open of the inode version read with them, as a lookup's do. A stale
    /// or made-up item costs a wasted read, not a wrong answer. Read as a
    /// command's, not a filesystem call's: a held directory is not read
    /// whole for one name.
    pub fn read_ahead(&self, hint: &[u8]) -> FsResult<()> {
        let items: Vec<(String, u64, u64)> =
            serde_json::from_slice(hint).map_err(|_| FsError::Invalid)?;
        if items.len() > READ_AHEAD_MAX {
            return Err(FsError::Invalid);
        }
        let mut keys = Vec::with_capacity(items.len() * 3);
        // (inode, its piece, where its inode's key is in `keys`)
        let mut pieces = Vec::new();
        for (id, ino, size) in items {
            keys.push((Idx::Entries, id));
            keys.push((Idx::Inodes, inode_id(ino)));
            if (1..=PREFETCH_MAX).contains(&size)
                && let Some(piece) = self.data.first_piece(&ino.to_string())
            {
                keys.push((piece.index, piece.id.clone()));
                pieces.push((ino, piece, keys.len() - 2));
            }
        }
        let docs = self
            .store
            .for_caller(Caller::Command)
            .mget_docs(&keys, true)?;
        for (ino, piece, at) in pieces {
            self.offer_piece(ino, Some(piece), &docs[at..at + 2]);
        }
        Ok(())
    }

    /// What to read along with entry `e`: its inode unless cached, then a
    /// small file's first bytes unless held (which `offer_piece` hands
    /// to the data store). The entry's size copy picks the files; the
    /// inode read with the bytes decides whether they serve.
    fn along(&self, e: &Entry) -> (Vec<(Idx, String)>, Option<Piece>) {
        if self.docs.holds_inode(e.ino) {
            return (Vec::new(), None);
        }
        let id = inode_id(e.ino);
        let small = e.kind == Kind::File && (1..=PREFETCH_MAX).contains(&e.size);
        // A file's content key is its inode number (see make_node).
        let piece = small
            .then(|| self.data.first_piece(&e.ino.to_string()))
            .flatten();
        let mut keys = vec![(Idx::Inodes, id)];
        keys.extend(piece.iter().map(|p| (p.index, p.id.clone())));
        (keys, piece)
    }

    /// `docs`: the inode and the piece `along` named, as read.
    fn offer_piece(&self, ino: u64, piece: Option<Piece>, docs: &[Option<Doc>]) {
        let (Some(piece), Some(Some(idoc))) = (piece, docs.first()) else {
            return;
        };
        let key = ino.to_string();
        if let Ok(inode) = idoc.parse::<Inode>()
            && inode.content.as_deref() == Some(key.as_str())
        {
            let doc = docs.get(1).and_then(|d| d.as_ref());
            self.data.offer(&key, piece, doc, inode.size, idoc.version);
        }
    }

    pub fn setattr(&self, ctx: Ctx, ino: u64, set: SetAttr) -> FsResult<Inode> {
        let _ = ctx; // ownership rules are enforced by the kernel (default_permissions)
        if let Some(inode) = self.set_times_in_memory(ino, &set)? {
            return Ok(inode);
        }
        if let Some(inode) = self.truncate_in_memory(ino, &set)? {
            return Ok(inode);
        }
        // Persist pending writes first so they cannot overwrite what we set.
        self.files.persist(ino)?;
        let now = now_ns();
        let mut change = None;
        if let Some(size) = set.size {
            let (inode, _) = self.docs.inode(ino)?;
            match inode.kind {
                Kind::File => {}
                Kind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid),
            }
            if let Some(key) = inode.content {
                self.data.truncate(&key, size)?;
                // Contents in object storage: the cut is a map change,
                // committed with the size below (see `DataStore::stage`).
                change = self.data.stage(&key)?.map(|c| (key, c));
            }
        }
        let mut landed = None;
        // A pending atime goes in with this write, unless this sets atime.
        let pending = self.pending.take_atime(ino);
        // The inode and its entries' attribute copies in one bulk.
        let inode = self.docs.update_synced(ino, |i| {
            if let Some(m) = set.mode {
                i.mode = m & 0o7777;
            }
            if let Some(u) = set.uid {
                i.uid = u;
            }
            if let Some(g) = set.gid {
                i.gid = g;
            }
            if let Some((_, c)) = &change {
                landed = Some(c.apply(&mut i.map));
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
        if let (Some((key, c)), Some((old, new))) = (&change, &landed) {
            self.data.committed(key, c, old, new);
        }
        self.files.refresh(&inode);
        if let (true, Some(key), true) = (
            self.pending.lazy(),
            &inode.content,
            set.size.is_some() || set.mtime.is_some(),
        ) {
            // Keep the data's mtime the file's (see `WriteBack::replay`).
            self.data.set_mtime(key, inode.mtime_ns)?;
        }
        if (set.size.is_some() || set.mtime.is_some()) && inode.kind == Kind::File {
            self.hook.changed(ino);
        }
        Ok(inode)
    }

    /// A setattr of a write's times alone, with lazy close: kept in the
    /// file's state like a write's, so it costs no store write. In the
    /// kernel's writeback-cache mode a close of a written file sends one
    /// when the write moved the times (the kernel owns them and hands them
    /// over). Returns `None` for any other setattr.
    fn set_times_in_memory(&self, ino: u64, set: &SetAttr) -> FsResult<Option<Inode>> {
        let SetAttr {
            mode: None,
            uid: None,
            gid: None,
            size: None,
            atime: None,
            mtime,
            ctime: Some(ctime),
            handle: _,
        } = *set
        else {
            return Ok(None);
        };
        // Only the times of a write (mtime = ctime): recovery after a crash
        // gets them back from the data's mtime. A ctime of its own (the
        // kernel's after a link or rename) is persisted like any setattr.
        let Some(TimeSpec::At(mtime)) = mtime else {
            return Ok(None);
        };
        if mtime != ctime || !self.pending.lazy() {
            return Ok(None);
        }
        let mark = self.files.settle_mark(ino);
        let (mut inode, _) = self.docs.inode(ino)?;
        let Some(key) = inode.content.clone() else {
            return Ok(None);
        };
        if inode.kind != Kind::File {
            return Ok(None);
        }
        // What a crash recovery reads (see `WriteBack::replay`).
        self.data.set_mtime(&key, mtime)?;
        self.files.note_write(ino, 0, Some((mtime, ctime)))?;
        if !self.files.overlay(&mut inode, mark) {
            inode = self.files.attr(ino)?;
        }
        self.hook.changed(ino);
        Ok(Some(inode))
    }

    /// A truncate through an open file (open(2) with O_TRUNC, ftruncate(2))
    /// that the data store takes in memory (`DataStore::truncate_open`):
    /// kept in the file's state like a write, so the close that follows
    /// persists the size once, and the store sends the cut with the bytes
    /// written after it. `echo x > f` was a refresh, a search and four
    /// bulks (the chunks' deletes, the inode, the new chunk, the inode
    /// again); it is two bulks. Like a write, it reaches the cluster at the
    /// file's close or fsync. Returns `None` for any other setattr.
    fn truncate_in_memory(&self, ino: u64, set: &SetAttr) -> FsResult<Option<Inode>> {
        let SetAttr {
            mode: None,
            uid: None,
            gid: None,
            size: Some(size),
            atime: None,
            mtime: None | Some(TimeSpec::Now),
            ctime,
            handle: Some(fh),
        } = *set
        else {
            return Ok(None);
        };
        let now = now_ns();
        let mark = self.files.settle_mark(ino);
        let cut = |key: &str| self.data.truncate_open(key, size);
        if !self
            .files
            .truncate_held(ino, fh, size, (now, ctime.unwrap_or(now)), cut)?
        {
            return Ok(None);
        }
        let (mut inode, _) = self.docs.inode(ino)?;
        if !self.files.overlay(&mut inode, mark) {
            inode = self.files.attr(ino)?;
        }
        Ok(Some(inode))
    }

    /// fallocate(2): space is not reserved ahead (contents are sparse files or
    /// chunk documents), so plain allocation only extends the size and
    /// KEEP_SIZE succeeds without effect; punching or collapsing ranges is
    /// not supported.
    pub fn fallocate(&self, ino: u64, fh: u64, off: u64, len: u64, mode: i32) -> FsResult<()> {
        self.files.check_handle(ino, fh)?;
        let end = off.checked_add(len).ok_or(FsError::TooBig)?;
        match mode {
            0 => {
                let size = self.files.attr(ino)?.size;
                if end > size {
                    self.setattr(
                        Ctx::ROOT,
                        ino,
                        SetAttr {
                            size: Some(end),
                            ..Default::default()
                        },
                    )?;
                }
                Ok(())
            }
            libc::FALLOC_FL_KEEP_SIZE => Ok(()),
            _ => Err(FsError::NotSupported),
        }
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let (inode, _) = self.docs.inode(ino)?;
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
        let stored = self.inode_count.get(&*self.store)?;
        let pending = self.write_back.pending_deletions();
        let pending_blocks = pending.iter().map(|s| s.div_ceil(BLOCK_SIZE)).sum::<u64>();
        let pending = pending.len() as u64;
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
