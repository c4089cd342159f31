//! Absent names of directories larger than memory.
//!
//! The overlay answers "no such name" without asking the cluster in a
//! directory whose every name it holds (made under the delegation, or read
//! whole). Past the memory budget names leave, and such a directory used to
//! stop being answered from memory: in a directory of 500 000 files every
//! create's lookup of its new name became a GET to the cluster (a third of
//! the mount's time while `bench/scale` built a million files).
//!
//! Instead the overlay remembers a hash of each name that left (8 bytes in
//! a set, 16 as weighed): a name with no slot whose hash is not among them
//! is absent, since while the delegation holds nothing but this mount adds
//! names. A hash collision only costs the GET it would have cost before.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};

/// What each hash weighs against the budget (the set's slot and its share
/// of the table's spare room).
const WEIGHT: usize = 16;

#[derive(Default)]
pub(crate) struct Left {
    /// Per directory: the hashes of the entry ids that left memory.
    dirs: HashMap<u64, HashSet<u64>>,
    hasher: RandomState,
    /// What the hashes weigh, for the budget.
    bytes: usize,
}

impl Left {
    /// Entry `id` of directory `dir`, whose every other name is held or
    /// recorded here, left memory (its document is in the cluster).
    pub(crate) fn left(&mut self, dir: u64, id: &str) {
        let h = self.hasher.hash_one(id);
        if self.dirs.entry(dir).or_default().insert(h) {
            self.bytes += WEIGHT;
        }
    }

    /// Whether this records `dir` (every name in it that has no slot left
    /// memory and is here).
    pub(crate) fn tracks(&self, dir: u64) -> bool {
        self.dirs.contains_key(&dir)
    }

    /// Whether entry `id` of a recorded directory `dir`, which has no slot,
    /// is absent (false for a directory not recorded).
    pub(crate) fn absent(&self, dir: u64, id: &str) -> bool {
        self.dirs
            .get(&dir)
            .is_some_and(|hs| !hs.contains(&self.hasher.hash_one(id)))
    }

    /// `dir`'s names are no longer known (or all held again).
    pub(crate) fn forget(&mut self, dir: u64) {
        if let Some(hs) = self.dirs.remove(&dir) {
            self.bytes -= hs.len() * WEIGHT;
        }
    }

    pub(crate) fn clear(&mut self) {
        self.dirs.clear();
        self.bytes = 0;
    }

    /// What the recorded hashes weigh against the budget.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_left_are_not_absent_others_are() {
        let mut l = Left::default();
        assert!(
            !l.absent(5, "5/a"),
            "a directory not recorded knows nothing"
        );
        l.left(5, "5/a");
        l.left(5, "5/a");
        assert!(l.tracks(5));
        assert!(!l.absent(5, "5/a"));
        assert!(l.absent(5, "5/b"));
        assert!(!l.absent(6, "6/b"));
        assert_eq!(l.bytes(), WEIGHT);
        l.left(6, "6/x");
        l.forget(5);
        assert!(!l.tracks(5) && !l.absent(5, "5/b"));
        assert_eq!(l.bytes(), WEIGHT);
        l.clear();
        assert_eq!(l.bytes(), 0);
        assert!(!l.tracks(6));
    }
}
