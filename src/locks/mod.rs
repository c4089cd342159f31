//! Namespace locking: `manager` holds the store-level locks that order
//! changes across mounts (the global, document and tree locks of
//! Elasticsearch: The Definitive Guide, chapter "Handling Relationships",
//! "Solving Concurrency Issues");
//! this file orders the threads of one mount before they get there.
//!
//! Every document carries its full path, so a directory rename must never run
//! while another change reads or writes paths under it. The mount-local
//! version of the Definitive Guide's tree locking:
//! - ordinary namespace changes take the tree lock *shared* plus exclusive
//!   locks on the directories whose entries they change (sorted, so two
//!   changes can never wait on each other in a cycle);
//! - a rename that moves a directory (and so rewrites a subtree's paths)
//!   takes the tree lock *exclusive*.
//!
//! Directory locks are striped: a fixed array of mutexes indexed by inode, so
//! locking allocates nothing and needs no cleanup; two directories sharing a
//! stripe only serialize, which is harmless.

pub(crate) mod delegation;
pub mod manager;
mod process;

pub use manager::{LockError, LockManager, TreeGuard};

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

const STRIPES: usize = 256;

pub struct NamespaceLocks {
    tree: RwLock<()>,
    dirs: Vec<Mutex<()>>,
}

impl Default for NamespaceLocks {
    fn default() -> Self {
        NamespaceLocks {
            tree: RwLock::new(()),
            dirs: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }
}

/// Held for the duration of a namespace change; dropping releases in reverse
/// order of acquisition (directory stripes, then the tree lock).
pub enum NsGuard<'a> {
    Shared {
        dirs: Vec<MutexGuard<'a, ()>>,
        _tree: RwLockReadGuard<'a, ()>,
    },
    Exclusive(RwLockWriteGuard<'a, ()>),
}

impl NamespaceLocks {
    /// Lock the directories `dirs` (inode numbers) for an entry change.
    pub fn dirs(&self, dirs: &[u64]) -> NsGuard<'_> {
        let tree = self.tree.read();
        let mut stripes: Vec<usize> = dirs.iter().map(|d| (*d as usize) % STRIPES).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let dirs = stripes.into_iter().map(|s| self.dirs[s].lock()).collect();
        NsGuard::Shared { dirs, _tree: tree }
    }

    /// Lock the whole namespace (directory moves).
    pub fn exclusive(&self) -> NsGuard<'_> {
        NsGuard::Exclusive(self.tree.write())
    }
}

impl Drop for NsGuard<'_> {
    fn drop(&mut self) {
        if let NsGuard::Shared { dirs, .. } = self {
            // Release the stripes longest-held-last, like the Definitive Guide's reverse order.
            while dirs.pop().is_some() {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn exclusive_waits_for_shared() {
        let l = Arc::new(NamespaceLocks::default());
        let g = l.dirs(&[1, 2, 258]);
        let l2 = l.clone();
        let t = std::thread::spawn(move || {
            let _x = l2.exclusive();
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !t.is_finished(),
            "exclusive must wait while a shared holder runs"
        );
        drop(g);
        t.join().unwrap();
    }

    #[test]
    fn same_stripe_twice_does_not_deadlock() {
        let l = NamespaceLocks::default();
        // 1 and 257 share a stripe: dedup must avoid self-deadlock.
        let _g = l.dirs(&[257, 1, 1]);
    }
}
