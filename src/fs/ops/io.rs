//! Open files: handles, reads and writes against the data store, and the
//! in-memory size/times of files being written.
//!
//! Writes go straight to the data store (so a killed mount loses nothing the
//! kernel handed over), but the inode document is only rewritten on flush,
//! fsync, close and setattr: one store write per close instead of one per
//! write(2). Until then `getattr` overlays the in-memory size and times.
//!
//! Handle 0 ([`NO_HANDLE`]) is the kernel's no-open mode (the FUSE glue
//! turns it on for a mount that is its store's only user): no OPEN or
//! RELEASE reaches us, reads and writes come with handle 0 and state is
//! made on first use. With lazy close (the embedded store) no FLUSH comes
//! either: `write_back` (in `crate::fs::writeback`) persists and drops
//! states every second, and the unflushed journal (`crate::fs::journal`)
//! covers a crash before it; otherwise FLUSH (every close) persists and
//! drops them. An unlinked file goes after
//! the inode's FORGET, which the kernel sends only once no descriptor holds
//! the inode.

use crate::fs::*;
use std::sync::atomic::Ordering;

/// Per-inode state while at least one handle is open (in no-open mode:
/// from first read or write until the kernel forgets the inode).
pub(in crate::fs) struct OpenState {
    pub(in crate::fs) count: u32,
    key: Option<String>,
    size: u64,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    /// Something differs from the stored inode: atime (a read moved it) or,
    /// with `wrote`, size and times.
    pub(in crate::fs) dirty: bool,
    /// size, mtime and ctime too (a write moved them). Only what moved is
    /// written back: the state may be older than a link, rename or chmod
    /// that changed the stored ctime since.
    pub(in crate::fs) wrote: bool,
    /// Bumped by every change, so a persist only clears `dirty` if nothing
    /// happened while it was writing.
    epoch: u64,
}

pub(in crate::fs) struct Handle {
    ino: u64,
}

/// The handle of every file in the kernel's no-open mode.
const NO_HANDLE: u64 = 0;

/// Stripes of `Fs::settled`: a persist makes only the readers of inodes
/// of its stripe read again.
pub(in crate::fs) const SETTLE_STRIPES: usize = 32;

impl OpenState {
    pub(in crate::fs) fn open_handles(&self) -> u32 {
        self.count
    }

    fn of(inode: &Inode) -> OpenState {
        OpenState {
            count: 0,
            key: inode.content.clone(),
            size: inode.size,
            atime_ns: inode.atime_ns,
            mtime_ns: inode.mtime_ns,
            ctime_ns: inode.ctime_ns,
            dirty: false,
            wrote: false,
            epoch: 0,
        }
    }

    /// Lay the not-yet-persisted fields over the stored inode.
    fn apply(&self, i: &mut Inode) {
        if self.dirty {
            i.atime_ns = i.atime_ns.max(self.atime_ns);
        }
        if self.wrote {
            i.size = self.size;
            i.mtime_ns = self.mtime_ns;
            i.ctime_ns = i.ctime_ns.max(self.ctime_ns);
        }
    }
}

/// relatime: atime moves on read only if it is older than mtime/ctime or a day.
const RELATIME_NS: i64 = 24 * 3600 * 1_000_000_000;

impl Fs {
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<u64> {
        let (inode, version) = self.docs.inode(ino).map_err(stale)?;
        if inode.kind == Kind::Dir && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(FsError::IsDir);
        }
        self.register_open(&inode, Some(version))
    }

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
        let fh = self.register_open(&inode, None)?;
        Ok((inode, fh))
    }

    fn register_open(&self, inode: &Inode, version: Option<Version>) -> FsResult<u64> {
        let mut open = self.open.lock();
        // Its last name is going, or went, and its document with it (see
        // drop_link): the inode this open read is stale.
        if self.dying.lock().contains(&inode.ino) || self.gone.lock().1.contains(&inode.ino) {
            return Err(FsError::Stale);
        }
        let st = open
            .entry(inode.ino)
            .or_insert_with(|| self.new_state(inode, version));
        st.count += 1;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Handle { ino: inode.ino });
        Ok(fh)
    }

    /// The state of a file being opened; the data store hears how long
    /// the file is, and which inode version (its state's release is the
    /// data store's too).
    fn new_state(&self, inode: &Inode, version: Option<Version>) -> OpenState {
        if let Some(key) = &inode.content {
            self.data.opening(key, inode.size, version);
        }
        OpenState::of(inode)
    }

    pub(in crate::fs) fn is_open(&self, ino: u64) -> bool {
        self.open.lock().contains_key(&ino)
    }

    /// The size an open state of `ino` holds, if it has one.
    pub(in crate::fs) fn open_size(&self, ino: u64) -> Option<u64> {
        self.open.lock().get(&ino).map(|st| st.size)
    }

    fn check_handle(&self, ino: u64, fh: u64) -> FsResult<()> {
        if fh == NO_HANDLE {
            return Ok(());
        }
        match self.handles.lock().get(&fh) {
            Some(h) if h.ino == ino => Ok(()),
            _ => Err(FsError::BadHandle),
        }
    }

    /// Content key and current size of an open file.
    fn open_file(&self, ino: u64, fh: u64) -> FsResult<(String, u64)> {
        self.check_handle(ino, fh)?;
        let (key, size) = self.with_state(ino, |st| (st.key.clone(), st.size))?;
        Ok((key.ok_or(FsError::Invalid)?, size))
    }

    /// Apply `f` to the open state of `ino`, made from its inode when absent
    /// (no-open mode; a handle keeps its state until its release). A state
    /// is only dropped once persisted and clean, so the stored inode then
    /// holds everything it knew: unless another state was made, changed
    /// and dropped while the inode was being read, hence the settle mark.
    fn with_state<T>(&self, ino: u64, f: impl FnOnce(&mut OpenState) -> T) -> FsResult<T> {
        loop {
            let mark = {
                let mut open = self.open.lock();
                if let Some(st) = open.get_mut(&ino) {
                    return Ok(f(st));
                }
                self.settle_mark(ino)
            };
            let (inode, version) = self.docs.inode(ino)?;
            if inode.kind == Kind::Dir {
                return Err(FsError::IsDir);
            }
            let mut open = self.open.lock();
            if open.contains_key(&ino) || self.settle_mark(ino) != mark {
                continue;
            }
            let st = self.new_state(&inode, Some(version));
            return Ok(f(open.entry(ino).or_insert(st)));
        }
    }

    pub fn read(&self, ino: u64, fh: u64, off: u64, size: u32) -> FsResult<Vec<u8>> {
        let (key, fsize) = self.open_file(ino, fh)?;
        if off >= fsize {
            return Ok(Vec::new());
        }
        let n = (fsize - off).min(size as u64) as usize;
        let mut buf = vec![0u8; n];
        // Bytes past what the store holds are a hole: they stay zero.
        self.data.read(&key, off, &mut buf)?;
        self.accessed(ino)?;
        Ok(buf)
    }

    /// A read of `ino`: atime moves as `relatime` says.
    fn accessed(&self, ino: u64) -> FsResult<()> {
        let now = now_ns();
        self.with_state(ino, |st| {
            if st.atime_ns <= st.mtime_ns
                || st.atime_ns <= st.ctime_ns
                || now - st.atime_ns > RELATIME_NS
            {
                st.atime_ns = now;
                st.dirty = true;
                st.epoch += 1;
            }
        })
    }

    pub fn write(&self, ino: u64, fh: u64, off: u64, data: &[u8]) -> FsResult<u32> {
        let (key, _) = self.open_file(ino, fh)?;
        let end = off.checked_add(data.len() as u64).ok_or(FsError::TooBig)?;
        self.write_range(ino, end, |ns| match ns {
            Some(ns) => self.data.write_stamped(&key, off, data, ns),
            None => self.data.write(&key, off, data),
        })?;
        Ok(data.len() as u32)
    }

    /// What every write does around storing its bytes (`put`, given the
    /// mtime to stamp the data with under lazy close): the size grows to
    /// `end`, times move, the file's state turns dirty and is journaled.
    fn write_range(
        &self,
        ino: u64,
        end: u64,
        put: impl FnOnce(Option<i64>) -> std::io::Result<()>,
    ) -> FsResult<()> {
        if end > i64::MAX as u64 {
            return Err(FsError::TooBig);
        }
        let kernel_times = self.kernel_times.load(Ordering::Relaxed);
        let now = if kernel_times {
            // The time the kernel gave this file last: a newer one follows
            // in a SETATTR if the write moved it.
            self.with_state(ino, |st| st.mtime_ns)?
        } else {
            now_ns()
        };
        // With the journal, the data's own mtime is what a crash recovery
        // will read.
        put(self.pending.lazy().then_some(now))?;
        self.note_write(ino, |st| {
            st.size = st.size.max(end);
            if !kernel_times {
                st.mtime_ns = now;
                st.ctime_ns = now;
            }
        })
    }

    /// copy_file_range(2) within this filesystem: up to `len` bytes of
    /// `ino_in` from `off_in` (fewer at its end) to `ino_out` at `off_out`,
    /// copied inside the data store, never through the kernel. The
    /// destination changes as by a write (size, times, lazy-close state
    /// and journal); the kernel clears setuid/setgid first, as it does
    /// before a write. Returns the bytes copied.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        let (src, size) = self.open_file(ino_in, fh_in)?;
        let (dst, _) = self.open_file(ino_out, fh_out)?;
        if off_in >= size || len == 0 {
            return Ok(0);
        }
        // The reply counts bytes in 32 bits: a larger request is answered
        // in part, and the caller asks again for the rest.
        let n = len.min(size - off_in).min(u32::MAX as u64 & !0xfff);
        let end = off_out.checked_add(n).ok_or(FsError::TooBig)?;
        self.write_range(ino_out, end, |ns| {
            self.data.copy_range(&src, off_in, &dst, off_out, n, ns)
        })?;
        self.accessed(ino_in)?;
        Ok(n)
    }

    /// Apply what a write changed (`f`) to `ino`'s state, mark it written,
    /// and journal it.
    fn note_write(&self, ino: u64, f: impl FnOnce(&mut OpenState)) -> FsResult<()> {
        self.with_state(ino, |st| {
            f(st);
            st.dirty = true;
            st.wrote = true;
            st.epoch += 1;
        })?;
        // After the state turned dirty, before the reply: a write-back
        // that settles the journal in between sees the state dirty and
        // keeps the mark, or already persisted this write.
        self.pending.mark_file(ino)
    }

    /// A setattr of a write's times alone, with lazy close: kept in the
    /// file's state like a write's, so it costs no store write. In the
    /// kernel's writeback-cache mode a close of a written file sends one
    /// when the write moved the times (the kernel owns them and hands them
    /// over). Returns `None` for any other setattr.
    pub(in crate::fs) fn set_times_in_memory(
        &self,
        ino: u64,
        set: &SetAttr,
    ) -> FsResult<Option<Inode>> {
        let SetAttr {
            mode: None,
            uid: None,
            gid: None,
            size: None,
            atime: None,
            mtime,
            ctime: Some(ctime),
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
        if mtime != ctime || !self.lazy_close() {
            return Ok(None);
        }
        let mark = self.settle_mark(ino);
        let (mut inode, _) = self.docs.inode(ino)?;
        let Some(key) = inode.content.clone() else {
            return Ok(None);
        };
        if inode.kind != Kind::File {
            return Ok(None);
        }
        // What a crash recovery reads (see `replay_journal`).
        self.data.set_mtime(&key, mtime)?;
        self.note_write(ino, |st| {
            st.mtime_ns = mtime;
            st.ctime_ns = ctime;
        })?;
        if !self.overlay(&mut inode, mark) {
            inode = self.getattr(ino)?;
        }
        self.content_changed(ino);
        Ok(Some(inode))
    }

    /// fallocate(2): space is not reserved ahead (contents are sparse files or
    /// chunk documents), so plain allocation only extends the size and
    /// KEEP_SIZE succeeds without effect; punching or collapsing ranges is
    /// not supported.
    pub fn fallocate(&self, ino: u64, fh: u64, off: u64, len: u64, mode: i32) -> FsResult<()> {
        self.check_handle(ino, fh)?;
        let end = off.checked_add(len).ok_or(FsError::TooBig)?;
        match mode {
            0 => {
                let size = self.getattr(ino)?.size;
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

    /// close(2) of one descriptor: make size and times visible in the store.
    pub fn flush(&self, ino: u64, fh: u64) -> FsResult<()> {
        self.check_handle(ino, fh)?;
        self.persist(ino)?;
        if fh == NO_HANDLE {
            // Made again on the next read or write (from the inode just
            // persisted): no state outlives its use.
            self.drop_state(ino)?;
        }
        Ok(())
    }

    pub fn fsync(&self, ino: u64, fh: u64) -> FsResult<()> {
        self.check_handle(ino, fh)?;
        let key = match self.open.lock().get(&ino) {
            Some(st) => st.key.clone(),
            None => self.docs.inode(ino)?.0.content,
        };
        if let Some(key) = key {
            self.data.sync(&key)?;
        }
        self.persist(ino)?;
        // fsync writes a pending atime too, as under `lazytime`.
        if let Some(a) = self.pending.take_atime(ino) {
            match self.docs.update(ino, |i| {
                i.atime_ns = i.atime_ns.max(a);
                Ok(())
            }) {
                Ok(_) | Err(FsError::NotFound) => {}
                Err(e) => {
                    self.pending.restore_atime(ino, a);
                    return Err(e);
                }
            }
        }
        self.store.sync()?;
        Ok(())
    }

    /// Last close of a handle; the last handle of an unlinked file deletes it.
    pub fn release(&self, ino: u64, fh: u64) -> FsResult<()> {
        if self.handles.lock().remove(&fh).is_none() {
            return Err(FsError::BadHandle);
        }
        let last = match self.open.lock().get_mut(&ino) {
            Some(st) => {
                st.count -= 1;
                st.count == 0
            }
            None => false,
        };
        if !last {
            return Ok(());
        }
        self.persist(ino)?;
        self.drop_state(ino)
    }

    /// The last handle of `ino` is gone (release), or the kernel forgot it
    /// (no-open mode): drop its state, and delete an unlinked inode.
    pub(in crate::fs) fn drop_state(&self, ino: u64) -> FsResult<()> {
        let gone = {
            let mut open = self.open.lock();
            match open.get(&ino) {
                // Not if reopened meanwhile, or written since the persist
                // (a no-open writer's next close persists that).
                Some(st) if st.count == 0 && !st.dirty => {
                    self.settle(ino);
                    open.remove(&ino)
                }
                _ => None,
            }
        };
        if let Some(st) = gone {
            if let Some(key) = &st.key {
                self.data.release(key);
            }
            if !self.orphans.lock().contains(&ino) {
                return Ok(()); // it has a name (see `Fs::orphans`)
            }
            match self.docs.inode(ino) {
                Ok((inode, _)) if inode.nlink == 0 && !self.in_use(ino) => {
                    self.destroy_inode(&inode)?
                }
                Ok(_) | Err(FsError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Write the in-memory size/times of an open file to its inode document,
    /// after the data they describe is flushed.
    pub(in crate::fs) fn persist(&self, ino: u64) -> FsResult<()> {
        let (wrote, atime, epoch, key) = match self.open.lock().get(&ino) {
            Some(st) if st.dirty => (st.wrote, st.atime_ns, st.epoch, st.key.clone()),
            _ => return Ok(()),
        };
        if !wrote {
            // Only atime moved (a read): written back lazily, as Linux's
            // lazytime does, not with a transaction on every close.
            self.pending.wait_atime(ino, atime);
            if let Some(st) = self.open.lock().get_mut(&ino)
                && st.epoch == epoch
            {
                st.dirty = false;
            }
            return Ok(());
        }
        if let Some(key) = key {
            self.data.flush(&key)?;
        }
        let pending = self.pending.take_atime(ino);
        let (mut changed, mut written) = (false, None);
        self.docs.update_synced(ino, |i| {
            // The state as of this attempt, not of the call: a persist
            // overtaken by a later one (closes racing a writer) fails its
            // version check, retries and writes the newer state, so the
            // stored size never goes back.
            let open = self.open.lock();
            let Some(st) = open.get(&ino) else {
                return Ok(());
            };
            changed = st.wrote && (i.size != st.size || i.mtime_ns != st.mtime_ns);
            st.apply(i);
            written = Some(st.epoch);
            if let Some(k) = &st.key {
                i.stored = self.data.stored_bytes(k, i.stored)?.or(i.stored);
            }
            if let Some(a) = pending {
                i.atime_ns = i.atime_ns.max(a);
            }
            Ok(())
        })?;
        if let Some(st) = self.open.lock().get_mut(&ino)
            && Some(st.epoch) == written
        {
            st.dirty = false;
            st.wrote = false;
            self.settle(ino);
        }
        if changed {
            self.content_changed(ino);
        }
        Ok(())
    }

    /// Open files with writes not yet persisted (their entries still
    /// describe the old contents): `esfs search` scans them.
    pub(crate) fn dirty_open_files(&self) -> Vec<u64> {
        self.open
            .lock()
            .iter()
            .filter(|(_, st)| st.wrote)
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// Taken before reading an inode that goes to [`Fs::overlay`].
    pub(in crate::fs) fn settle_mark(&self, ino: u64) -> u64 {
        self.settled[(ino % SETTLE_STRIPES as u64) as usize].load(Ordering::Acquire)
    }

    /// A state of `ino` moved its size and times to the store and stops
    /// overlaying them (call under the `open` lock).
    fn settle(&self, ino: u64) {
        self.settled[(ino % SETTLE_STRIPES as u64) as usize].fetch_add(1, Ordering::AcqRel);
    }

    /// Show not-yet-persisted size/times of an open file on `inode`, read
    /// from the store after `mark` was taken ([`Fs::settle_mark`]). False
    /// if a persist settled the file's state since: the inode read may
    /// predate it, and without the overlay would show an older size than
    /// the kernel knows (it shrinks the file to it: an O_APPEND write then
    /// lands on earlier data, `tail -F` sees a truncation). Read it again.
    pub(in crate::fs) fn overlay(&self, inode: &mut Inode, mark: u64) -> bool {
        let written;
        {
            let open = self.open.lock();
            if self.settle_mark(inode.ino) != mark {
                return false;
            }
            written = open.get(&inode.ino).and_then(|st| {
                st.apply(inode);
                st.key.clone().filter(|_| st.wrote)
            });
        }
        if let Some(k) = written {
            // Blocks written since the write-back: the data store knows
            // them without a round trip (a local call, or a count in memory).
            if let Ok(Some(b)) = self.data.stored_bytes(&k, inode.stored) {
                inode.stored = Some(b);
            }
        }
        if let Some(t) = self.pending.dir_time(inode) {
            inode.mtime_ns = inode.mtime_ns.max(t);
            inode.ctime_ns = inode.ctime_ns.max(t);
        }
        if let Some(a) = self.pending.atime(inode.ino) {
            inode.atime_ns = inode.atime_ns.max(a);
        }
        true
    }

    /// After setattr: the open state follows the stored inode.
    pub(in crate::fs) fn refresh_open(&self, inode: &Inode) {
        if let Some(st) = self.open.lock().get_mut(&inode.ino) {
            self.settle(inode.ino);
            st.size = inode.size;
            st.atime_ns = inode.atime_ns;
            st.mtime_ns = inode.mtime_ns;
            st.ctime_ns = inode.ctime_ns;
            st.epoch += 1;
            st.dirty = false;
            st.wrote = false;
        }
    }

    /// The kernel took over files' sizes and times (writeback-cache mode).
    pub fn kernel_keeps_times(&self) {
        self.kernel_times.store(true, Ordering::Relaxed);
        crate::model::use_kernel_clock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::LocalDataStore;
    use crate::model::{ROOT_INO, inode_id};
    use crate::store::gated::Gated;

    /// A getattr that read the inode just before a close persisted the
    /// file's size (and the overlay stopped) answered the older size; the
    /// kernel shrank the file to it, and the next O_APPEND write landed
    /// on earlier lines. It must read the inode again.
    #[test]
    fn getattr_across_a_persist_sees_the_persisted_size() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Gated::open(&dir.path().join("store")));
        let data = Arc::new(LocalDataStore::open(&dir.path().join("data")).unwrap());
        let fs = Arc::new(
            Fs::new(
                store.clone(),
                data,
                FsConfig {
                    label: "test".into(),
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let (inode, fh) = fs.create(Ctx::ROOT, ROOT_INO, b"log", 0o644, 0).unwrap();
        let ino = inode.ino;
        fs.write(ino, fh, 0, b"line\n").unwrap();
        let (stopped, go) = store.arm("get", Some(&inode_id(ino)));
        let stat = std::thread::spawn({
            let fs = fs.clone();
            move || fs.getattr(ino).unwrap().size
        });
        stopped.recv().unwrap(); // it read the inode of size 0
        fs.flush(ino, fh).unwrap();
        go.send(()).unwrap();
        assert_eq!(stat.join().unwrap(), 5);
        fs.release(ino, fh).unwrap();
    }

    /// An open(2) that read the inode before a rename over its name deleted
    /// it, and registered after, served the deleted contents as zeros (a
    /// shared store: nothing keeps an inode only the kernel names). It must
    /// answer ESTALE, so the kernel looks the name up again.
    #[test]
    fn open_across_a_deletion_of_its_inode_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Gated::open(&dir.path().join("store")));
        assert!(!store.capabilities().single_writer);
        let data = Arc::new(LocalDataStore::open(&dir.path().join("data")).unwrap());
        let fs = Arc::new(Fs::new(store.clone(), data, FsConfig::default()).unwrap());
        let (old, fh) = fs.create(Ctx::ROOT, ROOT_INO, b"target", 0o644, 0).unwrap();
        fs.write(old.ino, fh, 0, b"v0").unwrap();
        fs.release(old.ino, fh).unwrap();
        let (new, fh) = fs.create(Ctx::ROOT, ROOT_INO, b"tmp", 0o644, 0).unwrap();
        fs.write(new.ino, fh, 0, b"v1").unwrap();
        fs.release(new.ino, fh).unwrap();
        let (stopped, go) = store.arm("get", Some(&inode_id(old.ino)));
        let open = std::thread::spawn({
            let fs = fs.clone();
            move || fs.open(old.ino, libc::O_RDONLY)
        });
        stopped.recv().unwrap(); // it read the old inode
        fs.rename(ROOT_INO, b"tmp", ROOT_INO, b"target", 0).unwrap();
        go.send(()).unwrap();
        assert!(matches!(open.join().unwrap(), Err(FsError::Stale)));
    }
}
