//! The inode count statfs reports (`df -i`), kept off the syscall path on
//! a shared store.
//!
//! Counting the inodes index is a search: on Elasticsearch a refresh of
//! what this mount wrote and a `_count`, and on a mount holding the
//! delegation a flush of everything waiting before that (a search must see
//! every acknowledged write). Tools call statfs once per tree they walk
//! (`rm -rf`, `find`, `grep -r`, `cp -a` through fts), so that cost landed
//! at the start of each. On a shared store the count is therefore kept:
//! statfs answers from it at once, and when it is older than [`FRESH`] the
//! write-back's next pass (every second) counts again. `df -i` is then a
//! few seconds behind, as on other networked filesystems (JuiceFS answers
//! statfs from counters it refreshes in the background). The embedded
//! store counts exactly every time: its count is a local query.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::store::{Idx, MetaStore, Query, StoreResult};

/// How long a kept count is given as it is before a recount is asked.
const FRESH: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(super) struct InodeCount {
    /// The store's count is cheap and exact (the embedded store): no keeping.
    exact: bool,
    last: Mutex<Option<(u64, Instant)>>,
    /// A statfs found the kept count stale: the next pass counts.
    wanted: AtomicBool,
}

impl InodeCount {
    pub(super) fn new(exact: bool) -> InodeCount {
        InodeCount {
            exact,
            ..InodeCount::default()
        }
    }

    /// The number of inodes: counted now the first time (and always on an
    /// exact store), else the kept count, a recount asked if it is stale.
    pub(super) fn get(&self, store: &dyn MetaStore) -> StoreResult<u64> {
        if !self.exact
            && let Some((n, at)) = *self.last.lock()
        {
            if at.elapsed() > FRESH {
                self.wanted.store(true, Ordering::Relaxed);
            }
            return Ok(n);
        }
        self.count(store)
    }

    /// The write-back's pass: count again if a statfs asked.
    pub(super) fn recount_if_wanted(&self, store: &dyn MetaStore) {
        if self.wanted.swap(false, Ordering::Relaxed)
            && let Err(e) = self.count(store)
        {
            log::debug!("counting inodes for statfs: {e}");
        }
    }

    fn count(&self, store: &dyn MetaStore) -> StoreResult<u64> {
        let n = store.count(Idx::Inodes, &Query::MatchAll)?;
        *self.last.lock() = Some((n, Instant::now()));
        Ok(n)
    }
}
