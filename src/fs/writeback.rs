//! The write-back: what waits in memory (see [`super::pending`]) written
//! to the store in batches, by a background pass every second and at
//! unmount: closed files' sizes and times (lazy close), directory times,
//! stale entry copies, due atimes, and the deletion of unlinked inodes the
//! kernel forgot. At mount after a crash, the journal's files and
//! directories are caught up from their data.

use super::docs::{Docs, to_doc};
use super::files::OpenFiles;
use super::pending::{Pending, WRITE_BACK_BATCH};
use crate::data::DataStore;
use crate::error::{FsError, FsResult};
use crate::model::{Inode, Kind, inode_id, now_ns};
use crate::store::{BulkOp, Idx, MetaStore};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs work as one store batch, on the write-back of that batch (whose
/// parts reach the store through the batch's handles). Batches are made
/// above the parts, by the filesystem (`Fs::batch`).
pub(super) trait Batches {
    fn batch(&self, work: &mut dyn FnMut(&WriteBack) -> FsResult<()>) -> FsResult<()>;
}

pub(super) struct WriteBack {
    store: Arc<dyn MetaStore>,
    docs: Arc<Docs>,
    files: Arc<OpenFiles>,
    pending: Arc<Pending>,
    data: Arc<dyn DataStore>,
    /// The store's batches make one transaction of many writes (else the
    /// atimes go as one bulk).
    batches: bool,
    /// Inodes the kernel forgot, for the write-back to finish (lazy close).
    forgotten: Arc<Mutex<Vec<u64>>>,
    /// Set at unmount: the background passes stop.
    closing: Arc<AtomicBool>,
    /// Held by a background pass (unmount waits for it).
    in_pass: Arc<Mutex<()>>,
}

impl WriteBack {
    pub(super) fn new(
        store: Arc<dyn MetaStore>,
        docs: Arc<Docs>,
        files: Arc<OpenFiles>,
        pending: Arc<Pending>,
        data: Arc<dyn DataStore>,
    ) -> WriteBack {
        WriteBack {
            batches: store.capabilities().batches,
            store,
            docs,
            files,
            pending,
            data,
            forgotten: Arc::default(),
            closing: Arc::default(),
            in_pass: Arc::default(),
        }
    }

    /// This write-back through another caller's handles (one pass at a
    /// time, and one list of forgotten inodes, for all of them).
    pub(super) fn over(
        &self,
        store: Arc<dyn MetaStore>,
        docs: Arc<Docs>,
        files: Arc<OpenFiles>,
    ) -> WriteBack {
        WriteBack {
            batches: self.batches,
            store,
            docs,
            files,
            pending: self.pending.clone(),
            data: self.data.clone(),
            forgotten: self.forgotten.clone(),
            closing: self.closing.clone(),
            in_pass: self.in_pass.clone(),
        }
    }

    /// One background pass (every second): states (lazy close), else the
    /// stale entries; atimes when due. False once unmount began.
    pub(super) fn pass(&self, b: &dyn Batches) -> bool {
        let _pass = self.in_pass.lock();
        if self.closing.load(Ordering::Acquire) {
            return false;
        }
        let lazy = self.pending.lazy();
        if lazy && let Err(e) = self.write_back(b) {
            log::warn!("writing back file sizes and times: {e}");
        }
        if !lazy && let Err(e) = self.sync_stale_dirs(b) {
            log::warn!("refreshing directories' entries: {e}");
        }
        if !lazy {
            self.finish_forgotten_together();
        }
        if self.pending.atimes_due()
            && let Err(e) = self.write_back_atimes(b)
        {
            log::warn!("writing back access times: {e}");
        }
        true
    }

    /// Unmount: no background pass starts any more, and one in progress is
    /// waited for.
    pub(super) fn stop(&self) {
        self.closing.store(true, Ordering::Release);
        drop(self.in_pass.lock());
    }

    /// The kernel forgot `ino` (lazy close): deleting it if unlinked
    /// (marked orphan by its unlink, so a crash before this loses nothing:
    /// the next mount reclaims it) waits for the write-back, which deletes
    /// many per transaction.
    pub(super) fn defer_forget(&self, ino: u64) {
        self.forgotten.lock().push(ino);
    }

    /// Unlinked inodes the kernel let go of that the write-back has yet to
    /// delete (see `defer_forget`): their sizes.
    pub(super) fn pending_deletions(&self) -> Vec<u64> {
        let inos = self.forgotten.lock().clone();
        let mut sizes = Vec::new();
        for ino in inos {
            if self.files.held(ino) {
                continue;
            }
            if let Ok((inode, _)) = self.docs.inode(ino)
                && inode.nlink == 0
            {
                sizes.push(inode.size);
            }
        }
        sizes
    }

    /// Write the directory times waiting in memory to their inodes, many
    /// per transaction (each write absorbs its directory's time).
    pub(super) fn write_back_dir_times(&self, b: &dyn Batches) -> FsResult<()> {
        let dirs = self.pending.waiting_dirs();
        for chunk in dirs.chunks(256) {
            b.batch(&mut |wb| {
                for &ino in chunk {
                    match wb.docs.update(ino, |_| Ok(())) {
                        Ok(_) => {}
                        Err(FsError::NotFound) => self.pending.drop_dir_time(ino),
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Refreshes the entry documents of the directories `Tree::touch` left
    /// stale.
    fn sync_stale_dirs(&self, b: &dyn Batches) -> FsResult<()> {
        let dirs = self.pending.take_stale_dirs();
        for chunk in dirs.chunks(256) {
            b.batch(&mut |wb| {
                for &ino in chunk {
                    match wb.docs.inode(ino) {
                        Ok((inode, _)) => wb.docs.sync_entries(&inode)?,
                        Err(FsError::NotFound) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Write the pending atime updates to their inodes (when due, and at
    /// unmount; a `kill -9` loses at most the atimes of that wait, never
    /// anything else).
    pub(super) fn write_back_atimes(&self, b: &dyn Batches) -> FsResult<usize> {
        let pending = self.pending.take_atimes();
        let set = |i: &mut Inode, a: i64| {
            i.atime_ns = i.atime_ns.max(a);
            Ok(())
        };
        for chunk in pending.chunks(WRITE_BACK_BATCH) {
            if self.batches {
                b.batch(&mut |wb| {
                    for &(ino, a) in chunk {
                        match wb.docs.update(ino, |i| set(i, a)) {
                            Ok(_) | Err(FsError::NotFound) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(())
                })?;
                continue;
            }
            // No batches (Elasticsearch): one bulk of conditional writes
            // from the inodes as read, not a request per inode; one that
            // changed meanwhile is updated alone.
            let ids: Vec<String> = chunk.iter().map(|(ino, _)| inode_id(*ino)).collect();
            let mut ops = Vec::new();
            let mut sent = Vec::new();
            for (&(ino, a), doc) in chunk.iter().zip(self.store.mget(Idx::Inodes, &ids)?) {
                let Some(doc) = doc else { continue };
                let mut inode: Inode = doc.parse()?;
                set(&mut inode, a)?;
                ops.push(BulkOp::Index {
                    index: Idx::Inodes,
                    id: doc.id,
                    source: to_doc(&inode),
                    if_version: Some(doc.version),
                });
                sent.push((ino, a));
            }
            if ops.is_empty() {
                continue;
            }
            for ((ino, a), r) in sent.into_iter().zip(self.store.bulk(ops)?) {
                if r.is_ok() {
                    continue;
                }
                match self.docs.update(ino, |i| set(i, a)) {
                    Ok(_) | Err(FsError::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(pending.len())
    }

    /// Lazy close: delete the unlinked inodes the kernel forgot, refresh
    /// the entries of changed directories, write the states of written
    /// files to their inodes (many per transaction), drop the states no
    /// handle holds, and settle the journal.
    pub(super) fn write_back(&self, b: &dyn Batches) -> FsResult<()> {
        self.finish_forgotten(b)?;
        self.write_back_dir_times(b)?;
        self.sync_stale_dirs(b)?;
        let dirty = self.files.to_write_back();
        for chunk in dirty.chunks(WRITE_BACK_BATCH) {
            b.batch(&mut |wb| {
                for &ino in chunk {
                    match wb.files.persist(ino) {
                        Ok(()) | Err(FsError::NotFound) => {}
                        Err(e) => return Err(e),
                    }
                    // Drops only a clean state without handles (made again
                    // from the inode on the next read or write).
                    wb.files.drop_state(ino)?;
                }
                Ok(())
            })?;
        }
        self.pending
            .settle_journal(|ino| self.files.settled_in_store(ino))
    }

    /// Without batches (Elasticsearch): the forgets left to the write-back
    /// (removed directories) finished with one bulk of deletes.
    fn finish_forgotten_together(&self) {
        let forgotten = std::mem::take(&mut *self.forgotten.lock());
        if forgotten.is_empty() {
            return;
        }
        let again = self.files.finish_forgets(&forgotten);
        self.forgotten.lock().extend(again);
    }

    /// Finish the forgets left to the write-back: unlinked inodes the
    /// kernel let go of are deleted, many per transaction.
    fn finish_forgotten(&self, b: &dyn Batches) -> FsResult<()> {
        if !self.pending.lazy() {
            self.finish_forgotten_together();
            return Ok(());
        }
        let forgotten = std::mem::take(&mut *self.forgotten.lock());
        for chunk in forgotten.chunks(WRITE_BACK_BATCH) {
            b.batch(&mut |wb| {
                for &ino in chunk {
                    wb.files.finish_forget(ino);
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Mount after a crash with lazy close: files the journal names may
    /// have writes whose size and mtime did not reach the store. The data
    /// store holds every byte written; take the size and time from it
    /// (only writes happened since the last persist, so sizes only grew).
    pub(super) fn replay(&self, b: &dyn Batches, inos: &[u64]) -> FsResult<()> {
        let mut recovered = 0;
        let mut dirs = 0;
        for &ino in inos {
            if self.catch_up_dir(b, ino)? {
                dirs += 1;
                continue;
            }
            if let Some((len, mtime)) = self.behind_data(ino)? {
                log::info!("inode {ino}: size and mtime recovered from its data");
                recovered += 1;
                self.catch_up_with_data(b, ino, len, mtime)?;
            }
        }
        if dirs > 0 {
            log::info!(
                "crash recovery: times of {dirs} directories changed just before the crash \
                 moved to now"
            );
        }
        if recovered > 0 {
            log::warn!(
                "crash recovery: sizes and mtimes of {recovered} file(s) closed just before \
                 the crash recovered from their data"
            );
        }
        Ok(())
    }

    /// A journaled directory (its mount died with its times in memory, see
    /// `Pending::wait_dir_time`): they move to now, which is no earlier than what was
    /// lost. False if `ino` is not a directory.
    fn catch_up_dir(&self, b: &dyn Batches, ino: u64) -> FsResult<bool> {
        match self.docs.inode(ino) {
            Ok((i, _)) if i.kind == Kind::Dir => {}
            Ok(_) | Err(FsError::NotFound) => return Ok(false),
            Err(e) => return Err(e),
        }
        let now = now_ns();
        b.batch(&mut |wb| {
            wb.docs
                .update(ino, |i| {
                    i.mtime_ns = i.mtime_ns.max(now);
                    i.ctime_ns = i.ctime_ns.max(now);
                    Ok(())
                })
                .and_then(|i| wb.docs.sync_entries(&i))
        })?;
        Ok(true)
    }

    /// A journaled file whose stored size or mtime lags its data (written
    /// just before a crash): the data's length and mtime.
    pub(super) fn behind_data(&self, ino: u64) -> FsResult<Option<(u64, i64)>> {
        let inode = match self.docs.inode(ino) {
            Ok((i, _)) => i,
            Err(FsError::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(key) = &inode.content else {
            return Ok(None);
        };
        let Some((len, mtime)) = self.data.stat(key)? else {
            return Ok(None);
        };
        // The data's mtime follows every write and every mtime set
        // (write, setattr): exactly the file's mtime.
        if len <= inode.size && mtime == inode.mtime_ns {
            return Ok(None);
        }
        Ok(Some((len, mtime)))
    }

    /// Bring a file's stored size and mtime up to its data's.
    pub(super) fn catch_up_with_data(
        &self,
        b: &dyn Batches,
        ino: u64,
        len: u64,
        mtime: i64,
    ) -> FsResult<()> {
        b.batch(&mut |wb| {
            wb.docs
                .update(ino, |i| {
                    i.size = i.size.max(len);
                    i.mtime_ns = mtime;
                    i.ctime_ns = i.ctime_ns.max(mtime);
                    if let Some(k) = &i.content {
                        i.stored = wb.data.stored_bytes(k, i.stored)?.or(i.stored);
                    }
                    Ok(())
                })
                .and_then(|i| wb.docs.sync_entries(&i))
        })
    }
}
