//! Who still holds an inode besides its names: the kernel's lookup counts
//! (an inode whose last name is gone stays until the kernel forgets it),
//! the inodes this mount may have kept at zero links (orphans), and those
//! whose document is being deleted with their last name (dying) or was
//! lately (gone), which an open(2) must not bring back.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};

/// How many deleted inodes `Refs::gone` remembers: the race it closes lasts
/// one open(2), far shorter than this many deletions.
const GONE_MAX: usize = 1 << 16;

#[derive(Default)]
pub(super) struct Refs {
    /// Kernel lookup counts: an inode whose last name is gone stays until
    /// the kernel forgets it (a process may still open it by a cached name).
    lookups: Mutex<HashMap<u64, u64>>,
    /// Inodes this mount may have kept at zero links (orphans: unlinked
    /// while open or referenced): only these are read again when the last
    /// handle or kernel reference goes, to delete them. Every other inode
    /// a mount lets go of is left alone without a read (on a shared store
    /// another mount's orphans are that mount's to delete).
    orphans: Mutex<HashSet<u64>>,
    /// Inodes whose last name is being removed and whose document goes with
    /// it (shared stores): an open(2) of one answers ESTALE. Changed under
    /// the open files' lock.
    dying: Mutex<HashSet<u64>>,
    /// Inodes this mount deleted lately (bounded, oldest forgotten first):
    /// an open(2) that read the inode before the deletion and registers
    /// after it must not serve the deleted contents (zeros) either.
    gone: Mutex<(VecDeque<u64>, HashSet<u64>)>,
}

impl Refs {
    // ---- the kernel's references ----

    /// The kernel now holds one more reference to `ino` (an entry reply).
    pub(super) fn remember(&self, ino: u64) {
        *self.lookups.lock().entry(ino).or_insert(0) += 1;
    }

    /// The kernel dropped `n` references to `ino`; true if that was its
    /// last (it held some).
    pub(super) fn forget(&self, ino: u64, n: u64) -> bool {
        let mut l = self.lookups.lock();
        match l.get_mut(&ino) {
            Some(c) if *c > n => {
                *c -= n;
                false
            }
            Some(_) => {
                l.remove(&ino);
                true
            }
            None => false,
        }
    }

    /// Whether the kernel holds a reference to `ino`.
    pub(super) fn kernel_holds(&self, ino: u64) -> bool {
        self.lookups.lock().contains_key(&ino)
    }

    /// The position of the first of `inos` the kernel holds.
    pub(super) fn first_held(&self, inos: impl IntoIterator<Item = u64>) -> Option<usize> {
        let held = self.lookups.lock();
        inos.into_iter().position(|ino| held.contains_key(&ino))
    }

    // ---- orphans ----

    /// `ino` may be kept at zero links: read it again when it is let go.
    pub(super) fn orphan(&self, ino: u64) {
        self.orphans.lock().insert(ino);
    }

    /// `ino` has a name again, or is deleted.
    pub(super) fn unorphan(&self, ino: u64) {
        self.orphans.lock().remove(&ino);
    }

    pub(super) fn is_orphan(&self, ino: u64) -> bool {
        self.orphans.lock().contains(&ino)
    }

    // ---- deletions racing an open ----

    /// Whether an open(2) of `ino` is stale: its document is being, or
    /// was lately, deleted.
    pub(super) fn deleted(&self, ino: u64) -> bool {
        self.dying.lock().contains(&ino) || self.gone.lock().1.contains(&ino)
    }

    /// The document of `ino` is being deleted with its last name.
    pub(super) fn dying(&self, ino: u64) {
        self.dying.lock().insert(ino);
    }

    /// The deletion that [`Refs::dying`] announced is over; `deleted`: the
    /// document went.
    pub(super) fn died(&self, ino: u64, deleted: bool) {
        if deleted {
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
}
