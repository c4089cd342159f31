//! What this mount holds in memory for the store, and the journal that
//! covers it: directory times moved by names made or removed in them (lazy
//! close), directories whose entry documents' copies of their attributes
//! are stale, and atimes moved by reads. `getattr` overlays them, any write
//! of the inode takes them along, and the write-back (`super::writeback`)
//! writes the rest in batches. The unflushed journal ([`Journal`]) names
//! the files and directories whose sizes or times wait, for the next mount
//! after a crash.

use super::journal::Journal;
use crate::error::{FsError, FsResult};
use crate::model::{Inode, Kind, now_ns};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

/// How long an atime moved by reads alone may wait in memory. As Linux's
/// `lazytime` (whose bound is 12 h), it is written sooner with any other
/// change of its inode, by fsync, at unmount, or with a full batch
/// ([`WRITE_BACK_BATCH`] waiting): a read costs no write of its own.
const ATIME_MAX_WAIT_NS: i64 = 3600 * 1_000_000_000;
/// States persisted per transaction by the write-back, and the atimes that
/// make a batch due.
pub(super) const WRITE_BACK_BATCH: usize = 256;

#[derive(Default)]
pub(super) struct Pending {
    /// Directory mtime/ctime moved by a name made or removed in it and not
    /// yet in the store (lazy close): written back with the file sizes,
    /// overlaid by `getattr`, absorbed by any write of the directory, and
    /// covered by the journal (see [`Pending::wait_dir_time`]).
    dir_times: Mutex<HashMap<u64, i64>>,
    /// Directories whose entry documents' copies of their attributes (for
    /// searches) the write-back is to refresh.
    stale_dirs: Mutex<HashSet<u64>>,
    /// atime updates from reads not yet in the store.
    atimes: Mutex<HashMap<u64, i64>>,
    /// Files written but not yet persisted (lazy close; see [`Journal`]).
    /// Set once at mount, after the previous life's journal was replayed.
    journal: OnceLock<Journal>,
}

impl Pending {
    /// Start journaling (lazy close): close sends nothing from now on.
    pub(super) fn start_journal(&self, j: Journal) {
        let _ = self.journal.set(j);
    }

    /// Whether close(2) may skip esfs (lazy close): the journal covers
    /// what waits in memory.
    pub(super) fn lazy(&self) -> bool {
        self.journal.get().is_some()
    }

    /// A file has writes not in the store yet: the journal names it.
    pub(super) fn mark_file(&self, ino: u64) -> FsResult<()> {
        if let Some(j) = self.journal.get() {
            j.mark(ino)?;
        }
        Ok(())
    }

    /// Forget the journal's files and directories for which `clean` holds
    /// and no directory time waits.
    pub(super) fn settle_journal(&self, clean: impl Fn(u64) -> bool) -> FsResult<()> {
        if let Some(j) = self.journal.get() {
            j.settle(|ino| clean(ino) && !self.dir_times.lock().contains_key(&ino))?;
        }
        Ok(())
    }

    // ---- directory times ----

    /// The directory time of `inode` waiting in memory, if any.
    pub(super) fn dir_time(&self, inode: &Inode) -> Option<i64> {
        if inode.kind != Kind::Dir {
            return None;
        }
        self.dir_times.lock().get(&inode.ino).copied()
    }

    /// Whether a time of directory `ino` waits in memory.
    pub(super) fn dir_time_waits(&self, ino: u64) -> bool {
        self.dir_times.lock().contains_key(&ino)
    }

    /// The directories whose times wait in memory.
    pub(super) fn waiting_dirs(&self) -> Vec<u64> {
        self.dir_times.lock().keys().copied().collect()
    }

    /// Directory `ino`'s times move to `now` in memory (lazy close only;
    /// false without the journal: the caller writes them). The journal
    /// names the directory first (the time goes in before the mark, so a
    /// settle in between keeps the mark): after a crash the next mount
    /// moves its times to its own start.
    pub(super) fn wait_dir_time(&self, ino: u64, now: i64) -> FsResult<bool> {
        let Some(j) = self.journal.get() else {
            return Ok(false);
        };
        self.dir_times
            .lock()
            .entry(ino)
            .and_modify(|t| *t = (*t).max(now))
            .or_insert(now);
        j.mark(ino)
            .map_err(|e| FsError::Io(format!("unflushed journal: {e}")))?;
        self.stale_dirs.lock().insert(ino);
        Ok(true)
    }

    /// Directory `ino` is gone: its waiting time with it.
    pub(super) fn drop_dir_time(&self, ino: u64) {
        self.dir_times.lock().remove(&ino);
    }

    /// `t` reached the store: drop it, unless a later time came meanwhile.
    fn settle_dir_time(&self, ino: u64, t: i64) {
        let mut times = self.dir_times.lock();
        if times.get(&ino) == Some(&t) {
            times.remove(&ino);
        }
    }

    /// Directory inodes' writes were acknowledged, each with the deferred
    /// time it took along. Only an acknowledged write settles: until then
    /// the time stays pending (a crash could still lose the write), and
    /// then the journal unmarks the directory if nothing newer waits, so
    /// that recovery does not move a time set afterwards (`touch -d`,
    /// `cp -a`) to its start. (A batch's writes settle when it ends: see
    /// `Docs::wrote_dir`.)
    pub(super) fn dirs_written(&self, done: &[(u64, Option<i64>)]) {
        let Some(j) = self.journal.get() else { return };
        if done.is_empty() {
            return;
        }
        for &(ino, t) in done {
            if let Some(t) = t {
                self.settle_dir_time(ino, t);
            }
        }
        let inos: Vec<u64> = done.iter().map(|(ino, _)| *ino).collect();
        if let Err(e) = j.unmark(&inos, |ino| self.dir_times.lock().contains_key(&ino)) {
            // The marks stay: recovery would move those times to its start.
            log::warn!("unflushed journal: {e}");
        }
    }

    // ---- stale entries ----

    /// The entry documents of directory `ino` hold stale copies of its
    /// attributes (only searches read them): the write-back refreshes them.
    pub(super) fn stale_dir(&self, ino: u64) {
        self.stale_dirs.lock().insert(ino);
    }

    pub(super) fn take_stale_dirs(&self) -> Vec<u64> {
        self.stale_dirs.lock().drain().collect()
    }

    // ---- atimes ----

    /// The atime of `ino` waiting in memory, if any.
    pub(super) fn atime(&self, ino: u64) -> Option<i64> {
        self.atimes.lock().get(&ino).copied()
    }

    /// A read moved `ino`'s atime to `atime`: it waits (as under `lazytime`).
    pub(super) fn wait_atime(&self, ino: u64, atime: i64) {
        self.atimes
            .lock()
            .entry(ino)
            .and_modify(|a| *a = (*a).max(atime))
            .or_insert(atime);
    }

    /// The atime of `ino` waiting, taken to go with a write of its inode.
    pub(super) fn take_atime(&self, ino: u64) -> Option<i64> {
        self.atimes.lock().remove(&ino)
    }

    /// A taken atime whose write failed waits again (unless a newer came).
    pub(super) fn restore_atime(&self, ino: u64, atime: i64) {
        self.atimes.lock().entry(ino).or_insert(atime);
    }

    /// Whether the atimes waiting in memory are due: a full batch, or one
    /// waiting for [`ATIME_MAX_WAIT_NS`] (the values are the reads' times).
    pub(super) fn atimes_due(&self) -> bool {
        let a = self.atimes.lock();
        a.len() >= WRITE_BACK_BATCH
            || a.values()
                .min()
                .is_some_and(|&t| now_ns() - t >= ATIME_MAX_WAIT_NS)
    }

    /// Every atime waiting, taken to be written.
    pub(super) fn take_atimes(&self) -> Vec<(u64, i64)> {
        self.atimes.lock().drain().collect()
    }

    /// Inode `ino` is gone: what waited for it goes too.
    pub(super) fn forget(&self, ino: u64) {
        self.dir_times.lock().remove(&ino);
        self.atimes.lock().remove(&ino);
    }
}
