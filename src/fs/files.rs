//! Files in use: the state of each open file (its size and times not yet
//! in the store, overlaid on what the store says), the handles that hold
//! them, and an inode's life past its last name: kept while a handle or
//! the kernel references it (an orphan), deleted once nothing does.
//!
//! Writes go straight to the data store (so a killed mount loses nothing the
//! kernel handed over), but the inode document is only rewritten on flush,
//! fsync, close and setattr: one store write per close instead of one per
//! write(2). Until then `attr` overlays the in-memory size and times.
//!
//! Handle 0 ([`NO_HANDLE`]) is the kernel's no-open mode (the FUSE glue
//! turns it on for a mount that is its store's only user): no OPEN or
//! RELEASE reaches us, reads and writes come with handle 0 and state is
//! made on first use. With lazy close (the embedded store) no FLUSH comes
//! either: the write-back (`super::writeback`) persists and drops states
//! every second, and the unflushed journal (`super::journal`) covers a
//! crash before it; otherwise FLUSH (every close) persists and drops them.
//! An unlinked file goes after the inode's FORGET, which the kernel sends
//! only once no descriptor holds the inode.

use super::docs::{Docs, Fate, stale, to_doc};
use super::pending::Pending;
use super::refs::Refs;
use super::tree::Tree;
use crate::data::DataStore;
use crate::error::{FsError, FsResult};
use crate::hook::HookSlot;
use crate::model::{Inode, Kind, inode_id, now_ns};
use crate::store::{BulkOp, Idx, MetaStore, Query, StoreError, Version, scan};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The handle of every file in the kernel's no-open mode.
pub(super) const NO_HANDLE: u64 = 0;

/// Stripes of `OpenFiles::settled`: a persist makes only the readers of
/// inodes of its stripe read again.
const SETTLE_STRIPES: usize = 32;

/// relatime: atime moves on read only if it is older than mtime/ctime or a day.
const RELATIME_NS: i64 = 24 * 3600 * 1_000_000_000;

/// Per-inode state while at least one handle is open (in no-open mode:
/// from first read or write until the kernel forgets the inode).
struct OpenState {
    count: u32,
    key: Option<String>,
    size: u64,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    /// Something differs from the stored inode: atime (a read moved it) or,
    /// with `wrote`, size and times.
    dirty: bool,
    /// size, mtime and ctime too (a write moved them). Only what moved is
    /// written back: the state may be older than a link, rename or chmod
    /// that changed the stored ctime since.
    wrote: bool,
    /// Bumped by every change, so a persist only clears `dirty` if nothing
    /// happened while it was writing.
    epoch: u64,
}

impl OpenState {
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

pub(super) struct OpenFiles {
    store: Arc<dyn MetaStore>,
    docs: Arc<Docs>,
    data: Arc<dyn DataStore>,
    /// Atimes and directory times waiting, and the journal.
    pending: Arc<Pending>,
    /// A deleted directory's place is forgotten there.
    tree: Arc<Tree>,
    /// Told when a file's contents may have changed.
    hook: Arc<HookSlot>,
    /// This mount is the store's only writer: nothing else deletes an
    /// inode the kernel still references.
    single_writer: bool,
    state: Arc<InUse>,
}

/// What the handles of the open files share (see [`OpenFiles::over`]).
pub(super) struct InUse {
    /// The state of each file in use, by inode.
    open: Mutex<HashMap<u64, OpenState>>,
    /// Handle -> the inode it opened.
    handles: Mutex<HashMap<u64, u64>>,
    next_fh: AtomicU64,
    /// The kernel's references and the orphans (`dying` changes under the
    /// `open` lock).
    refs: Refs,
    /// Per stripe of inode numbers (`ino % SETTLE_STRIPES`), bumped under
    /// the `open` lock whenever a state's size and times went to the store
    /// and left the overlay (a persist, setattr, drop): an inode read
    /// before is older than what the kernel was told, so it is read again
    /// (see [`OpenFiles::overlay`]).
    settled: [AtomicU64; SETTLE_STRIPES],
    /// The kernel keeps files' sizes and times (its writeback-cache mode):
    /// writes leave mtime/ctime to the SETATTR it sends at close.
    kernel_times: AtomicBool,
}

impl std::ops::Deref for OpenFiles {
    type Target = InUse;
    fn deref(&self) -> &InUse {
        &self.state
    }
}

impl OpenFiles {
    pub(super) fn new(
        store: Arc<dyn MetaStore>,
        docs: Arc<Docs>,
        data: Arc<dyn DataStore>,
        pending: Arc<Pending>,
        tree: Arc<Tree>,
        hook: Arc<HookSlot>,
    ) -> OpenFiles {
        OpenFiles {
            single_writer: store.capabilities().single_writer,
            store,
            docs,
            data,
            pending,
            tree,
            hook,
            state: Arc::new(InUse {
                open: Mutex::new(HashMap::new()),
                handles: Mutex::new(HashMap::new()),
                next_fh: AtomicU64::new(1),
                refs: Refs::default(),
                settled: Default::default(),
                kernel_times: Default::default(),
            }),
        }
    }

    /// These open files through another caller's handles.
    pub(super) fn over(
        &self,
        store: Arc<dyn MetaStore>,
        docs: Arc<Docs>,
        tree: Arc<Tree>,
    ) -> OpenFiles {
        OpenFiles {
            store,
            docs,
            data: self.data.clone(),
            pending: self.pending.clone(),
            tree,
            hook: self.hook.clone(),
            single_writer: self.single_writer,
            state: self.state.clone(),
        }
    }

    // ---- handles and states ----

    /// A new handle on `inode` (read at `version`, if known).
    pub(super) fn register(&self, inode: &Inode, version: Option<Version>) -> FsResult<u64> {
        let mut open = self.open.lock();
        // Its last name is going, or went, and its document with it (see
        // drop_link): the inode this open read is stale.
        if self.refs.deleted(inode.ino) {
            return Err(FsError::Stale);
        }
        let st = open
            .entry(inode.ino)
            .or_insert_with(|| self.new_state(inode, version));
        st.count += 1;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, inode.ino);
        Ok(fh)
    }

    /// The state of a file being opened; the data store hears how long
    /// the file is, and which inode version (its state's release is the
    /// data store's too).
    fn new_state(&self, inode: &Inode, version: Option<Version>) -> OpenState {
        if let Some(key) = &inode.content {
            self.data
                .opening(key, inode.size, version, inode.map.as_ref());
        }
        OpenState::of(inode)
    }

    /// Whether `ino` has a state (a handle open, or in no-open mode used).
    pub(super) fn is_open(&self, ino: u64) -> bool {
        self.open.lock().contains_key(&ino)
    }

    /// The size an open state of `ino` holds, if it has one.
    pub(super) fn open_size(&self, ino: u64) -> Option<u64> {
        self.open.lock().get(&ino).map(|st| st.size)
    }

    /// The content key of `ino`: its state's, else its inode's.
    pub(super) fn content_key(&self, ino: u64) -> FsResult<Option<String>> {
        let key = self.open.lock().get(&ino).map(|st| st.key.clone());
        match key {
            Some(key) => Ok(key),
            None => Ok(self.docs.inode(ino)?.0.content),
        }
    }

    /// `fh` must be a handle on `ino` (or the no-open mode's).
    pub(super) fn check_handle(&self, ino: u64, fh: u64) -> FsResult<()> {
        if fh == NO_HANDLE {
            return Ok(());
        }
        match self.handles.lock().get(&fh) {
            Some(&h) if h == ino => Ok(()),
            _ => Err(FsError::BadHandle),
        }
    }

    /// Content key and current size of an open file.
    pub(super) fn open_file(&self, ino: u64, fh: u64) -> FsResult<(String, u64)> {
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

    /// A handle is closed for the last time; the last handle of a file
    /// persists and drops its state (and deletes it if unlinked).
    pub(super) fn release(&self, ino: u64, fh: u64) -> FsResult<()> {
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

    // ---- reads and writes ----

    /// A read of `ino`: atime moves as `relatime` says.
    pub(super) fn accessed(&self, ino: u64) -> FsResult<()> {
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

    /// What every write does around storing its bytes (`put`, given the
    /// mtime to stamp the data with under lazy close): the size grows to
    /// `end`, times move, the file's state turns dirty and is journaled.
    pub(super) fn write_range(
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
        self.note_write(ino, end, (!kernel_times).then_some((now, now)))
    }

    /// What a write changed, applied to `ino`'s state: the size grows to
    /// `end`, mtime and ctime move to `times` (if they moved); the state
    /// is marked written and journaled.
    pub(super) fn note_write(&self, ino: u64, end: u64, times: Option<(i64, i64)>) -> FsResult<()> {
        self.with_state(ino, |st| {
            st.size = st.size.max(end);
            if let Some((mtime, ctime)) = times {
                st.mtime_ns = mtime;
                st.ctime_ns = ctime;
            }
            st.dirty = true;
            st.wrote = true;
            st.epoch += 1;
        })?;
        // After the state turned dirty, before the reply: a write-back
        // that settles the journal in between sees the state dirty and
        // keeps the mark, or already persisted this write.
        self.pending.mark_file(ino)
    }

    /// A truncate of `ino` to `size` through its handle `fh`, if `cut`
    /// (given the content key) takes it in memory: the state holds the
    /// new size and `times` (mtime, ctime) until it is persisted, as a
    /// write's. False: not open here with contents, or `cut` declined.
    pub(super) fn truncate_held(
        &self,
        ino: u64,
        fh: u64,
        size: u64,
        times: (i64, i64),
        cut: impl FnOnce(&str) -> std::io::Result<bool>,
    ) -> FsResult<bool> {
        if fh == NO_HANDLE || self.kernel_times.load(Ordering::Relaxed) {
            return Ok(false);
        }
        self.check_handle(ino, fh)?;
        let key = self.open.lock().get(&ino).and_then(|st| st.key.clone());
        let Some(key) = key else {
            return Ok(false);
        };
        if !cut(&key)? {
            return Ok(false);
        }
        self.with_state(ino, |st| {
            st.size = size;
            (st.mtime_ns, st.ctime_ns) = times;
            st.dirty = true;
            st.wrote = true;
            st.epoch += 1;
        })?;
        self.pending.mark_file(ino)?;
        Ok(true)
    }

    /// The kernel took over files' sizes and times (writeback-cache mode).
    pub(super) fn kernel_keeps_times(&self) {
        self.kernel_times.store(true, Ordering::Relaxed);
    }

    // ---- persisting ----

    /// Write the in-memory size/times of an open file to its inode document,
    /// after the data they describe is flushed.
    pub(super) fn persist(&self, ino: u64) -> FsResult<()> {
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
        // Uploaded first; a map change comes back to commit in the inode
        // with the size (see `DataStore::stage`).
        let change = match &key {
            Some(key) => self.data.stage(key)?,
            None => None,
        };
        let mut landed = None;
        let pending = self.pending.take_atime(ino);
        let (mut changed, mut written) = (false, None);
        let ride = match &key {
            Some(key) => self.data.ride_with_size(key),
            None => Vec::new(),
        };
        let riding = !ride.is_empty();
        let r = self.docs.update_synced_with(ino, ride, |i| {
            if let Some(c) = &change {
                // On every attempt: a conflict re-read the inode, and the
                // change goes over the map another mount committed.
                landed = Some(c.apply(&mut i.map));
            }
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
        });
        if let (Some(key), true) = (&key, riding) {
            self.data.sent_with_size(key, matches!(r, Ok((_, true))));
        }
        r?;
        if let (Some(key), Some(c), Some((old, new))) = (&key, &change, &landed) {
            self.data.committed(key, c, old, new);
        }
        if let Some(st) = self.open.lock().get_mut(&ino)
            && Some(st.epoch) == written
        {
            st.dirty = false;
            st.wrote = false;
            self.settle(ino);
        }
        if changed {
            self.hook.changed(ino);
        }
        Ok(())
    }

    /// The last handle of `ino` is gone (release), or the kernel forgot it
    /// (no-open mode): drop its state, and delete an unlinked inode.
    pub(super) fn drop_state(&self, ino: u64) -> FsResult<()> {
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
            if !self.refs.is_orphan(ino) {
                return Ok(()); // it has a name (see `Refs::orphans`)
            }
            match self.docs.inode(ino) {
                Ok((inode, _)) if inode.nlink == 0 && !self.in_use(ino) => self.destroy(&inode)?,
                Ok(_) | Err(FsError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Open files with writes not yet persisted (their entries still
    /// describe the old contents): `esfs search` scans them.
    pub(super) fn dirty(&self) -> Vec<u64> {
        self.open
            .lock()
            .iter()
            .filter(|(_, st)| st.wrote)
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// The states the write-back is to persist or drop: written, or held
    /// by no handle.
    pub(super) fn to_write_back(&self) -> Vec<u64> {
        let open = self.open.lock();
        open.iter()
            .filter(|(_, st)| st.dirty || st.count == 0)
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// Whether `ino`'s size and times are in the store (no state with
    /// writes holds newer ones).
    pub(super) fn settled_in_store(&self, ino: u64) -> bool {
        self.open.lock().get(&ino).is_none_or(|st| !st.wrote)
    }

    // ---- the overlay ----

    /// The inode as callers should see it: stored attributes plus the
    /// not-yet-persisted size/times of open files.
    pub(super) fn attr(&self, ino: u64) -> FsResult<Inode> {
        loop {
            let mark = self.settle_mark(ino);
            let (mut inode, _) = self.docs.inode(ino).map_err(stale)?;
            if self.overlay(&mut inode, mark) {
                return Ok(inode);
            }
        }
    }

    /// Taken before reading an inode that goes to [`OpenFiles::overlay`].
    pub(super) fn settle_mark(&self, ino: u64) -> u64 {
        self.settled[(ino % SETTLE_STRIPES as u64) as usize].load(Ordering::Acquire)
    }

    /// A state of `ino` moved its size and times to the store and stops
    /// overlaying them (call under the `open` lock).
    fn settle(&self, ino: u64) {
        self.settled[(ino % SETTLE_STRIPES as u64) as usize].fetch_add(1, Ordering::AcqRel);
    }

    /// Show not-yet-persisted size/times of an open file on `inode`, read
    /// from the store after `mark` was taken ([`OpenFiles::settle_mark`]).
    /// False if a persist settled the file's state since: the inode read
    /// may predate it, and without the overlay would show an older size
    /// than the kernel knows (it shrinks the file to it: an O_APPEND write
    /// then lands on earlier data, `tail -F` sees a truncation). Read it
    /// again.
    pub(super) fn overlay(&self, inode: &mut Inode, mark: u64) -> bool {
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
    pub(super) fn refresh(&self, inode: &Inode) {
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

    // ---- the kernel's references ----

    /// The kernel now holds one more reference to `ino` (an entry reply).
    pub(super) fn remember(&self, ino: u64) {
        self.refs.remember(ino);
    }

    /// The kernel dropped `n` references; true if it held `ino` and that
    /// was the last (then [`OpenFiles::finish_forget`] follows).
    pub(super) fn forget(&self, ino: u64, n: u64) -> bool {
        self.refs.forget(ino, n)
    }

    /// The position of the first of `inos` the kernel holds.
    pub(super) fn first_held(&self, inos: impl IntoIterator<Item = u64>) -> Option<usize> {
        self.refs.first_held(inos)
    }

    /// Whether a handle or the kernel holds `ino` (a state without
    /// handles does not: the no-open mode's).
    pub(super) fn held(&self, ino: u64) -> bool {
        let handles = self.open.lock().get(&ino).map(|st| st.count);
        handles.is_some_and(|h| h > 0) || self.refs.kernel_holds(ino)
    }

    /// Whether the kernel or an open state still references `ino`.
    fn in_use(&self, ino: u64) -> bool {
        self.is_open(ino) || self.refs.kernel_holds(ino)
    }

    /// Whether `ino` is an orphan this mount kept (an unlinked inode the
    /// kernel held) that no handle has open.
    pub(super) fn unused_orphan(&self, ino: u64) -> bool {
        self.refs.is_orphan(ino) && !self.is_open(ino)
    }

    /// [`OpenFiles::finish_forget`] of many: the orphans without contents
    /// (removed directories) nothing uses deleted in one bulk, the others
    /// one by one. Returns those whose bulk failed (to try again).
    pub(super) fn finish_forgets(&self, inos: &[u64]) -> Vec<u64> {
        let mut gone = Vec::new();
        // One read for all (each would be one where the cached copy expired).
        let ids: Vec<String> = inos.iter().map(|i| inode_id(*i)).collect();
        let docs = match self.store.mget(Idx::Inodes, &ids) {
            Ok(d) => d,
            Err(e) => {
                log::warn!("reading {} forgotten inodes: {e}", inos.len());
                return inos.to_vec();
            }
        };
        for (&ino, doc) in inos.iter().zip(docs) {
            let unused = self.unused_orphan(ino) && !self.refs.kernel_holds(ino);
            let dir = doc
                .and_then(|d| d.parse::<Inode>().ok())
                .is_some_and(|i| i.nlink == 0 && i.content.is_none());
            match unused && dir {
                true => gone.push(ino),
                false => self.finish_forget(ino),
            }
        }
        if gone.is_empty() {
            return gone;
        }
        let ops = gone
            .iter()
            .map(|ino| BulkOp::Delete {
                index: Idx::Inodes,
                id: inode_id(*ino),
                if_version: None,
            })
            .collect();
        let results = match self.store.bulk(ops) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("deleting {} removed directories: {e}", gone.len());
                return gone;
            }
        };
        let mut again = Vec::new();
        for (ino, r) in gone.into_iter().zip(results) {
            match r {
                Ok(_) | Err(StoreError::NotFound(_)) => {
                    self.refs.unorphan(ino);
                    self.forget_gone(ino);
                }
                Err(e) => {
                    log::warn!("deleting removed directory {ino}: {e}");
                    again.push(ino);
                }
            }
        }
        again
    }

    /// The kernel holds no reference to `ino` any more (unless it looked it
    /// up again since): persist and drop its state, delete it if unlinked.
    pub(super) fn finish_forget(&self, ino: u64) {
        if self.refs.kernel_holds(ino) {
            return; // looked up again; a later forget comes back here
        }
        let handles = self.open.lock().get(&ino).map(|st| st.count);
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
        if !self.refs.is_orphan(ino) {
            return;
        }
        match self.docs.inode(ino) {
            Ok((inode, _)) if inode.nlink == 0 => {
                if let Err(e) = self.destroy(&inode) {
                    log::error!("deleting unlinked inode {ino}: {e}");
                }
            }
            Ok(_) | Err(FsError::NotFound) => {}
            Err(e) => log::error!("forget {ino}: {e}"),
        }
    }

    // ---- names going, inodes deleted ----

    /// [`OpenFiles::drop_link`] of a removed directory the kernel still
    /// holds (the rmdir's own lookup, or a process's cwd), as a write for
    /// the caller's bulk: the link gone, the inode an orphan until the
    /// forget, conditional on the copy read. None where `drop_link` decides
    /// (nothing holds it: deleted at once). After the bulk:
    /// [`OpenFiles::dir_link_dropped`].
    pub(super) fn drop_dir_link_op(
        &self,
        ino: u64,
        parent: u64,
        ename: &str,
    ) -> FsResult<Option<BulkOp>> {
        if self.open.lock().contains_key(&ino) || !self.refs.kernel_holds(ino) {
            return Ok(None);
        }
        let (mut i, ver) = self.docs.inode(ino)?;
        let Some(pos) = i.links.iter().position(|l| l.p == parent && l.n == ename) else {
            return Ok(None);
        };
        if i.kind != Kind::Dir {
            return Ok(None);
        }
        i.links.remove(pos);
        i.nlink = 0;
        i.ctime_ns = now_ns();
        i.orphan = true;
        // Known before the write, so a forget racing it reads the inode again.
        self.refs.orphan(ino);
        Ok(Some(BulkOp::Index {
            index: Idx::Inodes,
            id: inode_id(ino),
            source: to_doc(&i),
            if_version: Some(ver),
        }))
    }

    /// After a [`OpenFiles::drop_dir_link_op`] item: if it did not land
    /// (the inode changed since read), the re-reading way.
    pub(super) fn dir_link_dropped(
        &self,
        ino: u64,
        parent: u64,
        ename: &str,
        landed: bool,
    ) -> FsResult<()> {
        match landed {
            true => Ok(()),
            false => self.drop_link(ino, parent, ename),
        }
    }

    /// One name of `ino` is gone: drop the link; at zero links delete the
    /// inode, unless it is still in use (then the last close or forget does).
    pub(super) fn drop_link(&self, ino: u64, parent: u64, ename: &str) -> FsResult<()> {
        self.drop_link_keeping(ino, parent, ename, false)
    }

    /// [`OpenFiles::drop_link`] of a name a rename replaced: the inode also
    /// stays while the kernel holds it (until its forget), on every store.
    /// A rename over a name must never fail an open(2) of that name, and a
    /// process whose path walk found the old inode just before the rename
    /// opens that inode: deleted at once, the open gets ESTALE, and the
    /// kernel's one retry can race the next rename over the same name (a
    /// program replacing a file in a loop while others read it; seen with
    /// contents in S3 under the delegation).
    pub(super) fn drop_replaced_link(&self, ino: u64, parent: u64, ename: &str) -> FsResult<()> {
        self.drop_link_keeping(ino, parent, ename, true)
    }

    fn drop_link_keeping(
        &self,
        ino: u64,
        parent: u64,
        ename: &str,
        keep_held: bool,
    ) -> FsResult<()> {
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
            let states = self.open.lock(); // held while marking: see register
            let open = states.contains_key(&ino);
            let held = keep_held && self.refs.kernel_holds(ino);
            let dying = !open && !held && !self.single_writer;
            if dying {
                self.refs.dying(ino);
            }
            (open, dying)
        };
        let r = self.drop_link_marked(ino, parent, ename, open, keep_held, now);
        if dying {
            // Under the open lock, as the mark was made: an open that read
            // the inode before its deletion sees it in `gone` instead.
            let _states = self.open.lock();
            let deleted = matches!(r, Ok(Fate::Delete { .. }));
            self.refs.died(ino, deleted);
        }
        r.map(drop)
    }

    fn drop_link_marked(
        &self,
        ino: u64,
        parent: u64,
        ename: &str,
        open: bool,
        keep_held: bool,
        now: i64,
    ) -> FsResult<Fate> {
        let referenced = open || self.refs.kernel_holds(ino);
        let keep_file = match self.single_writer || keep_held {
            true => referenced,
            false => open,
        };
        // Known before the write, so a release or forget racing it reads
        // the inode again.
        if referenced {
            self.refs.orphan(ino);
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
            self.refs.unorphan(ino);
        }
        match fate {
            Fate::Delete { .. } => self.forget_gone(ino),
            Fate::Keep => self.docs.sync_entries(&i)?,
        }
        Ok(fate)
    }

    /// Delete an inode's document and contents (its last name is gone and
    /// nothing has it open).
    fn destroy(&self, inode: &Inode) -> FsResult<()> {
        self.docs
            .delete_inode(inode, None, self.open_size(inode.ino))?;
        self.refs.unorphan(inode.ino);
        self.forget_gone(inode.ino);
        Ok(())
    }

    /// Inode `ino` is deleted: forget what this mount kept of it.
    fn forget_gone(&self, ino: u64) {
        self.tree.forget(ino);
        self.pending.forget(ino);
    }

    /// Inodes unlinked while open by a mount that then died.
    pub(super) fn reclaim_orphans(&self) -> FsResult<()> {
        let q = Query::term("orphan", true);
        let mut orphans = Vec::new();
        scan(&*self.store, Idx::Inodes, q, vec![], 1000, |hits| {
            orphans.extend(hits.into_iter().map(|h| h.doc));
            Ok(true)
        })?;
        for doc in orphans {
            let inode: Inode = doc.parse()?;
            log::info!("reclaiming inode {} unlinked while open", inode.ino);
            self.destroy(&inode)?;
        }
        Ok(())
    }
}
