//! Read-ahead of names for a walk of a directory the overlay cannot hold
//! whole (more than `WHOLE_MAX` names, or its names left memory for the
//! budget): `du`, `ls -l`, `rm -rf` look every name up in listing order,
//! and each miss cost two requests (the entry, then its inode). A second
//! miss in the same directory soon after the first is taken for a walk:
//! the names that follow the missed one in listing (cookie) order are read
//! with their inodes, in a window that doubles while the walk goes on, as
//! a kernel's file read-ahead does. A lone lookup (a build tool's `stat`)
//! reads nothing more.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Misses in one directory at most this far apart are one walk.
const WALK_GAP: Duration = Duration::from_secs(2);
/// The first read-ahead's names; each next one's doubles, up to
/// [`WINDOW_MAX`] (one search and one `_mget` of that many documents).
const WINDOW_MIN: usize = 256;
pub(super) const WINDOW_MAX: usize = 4096;

/// Recent misses per directory.
#[derive(Default)]
pub(super) struct Walks {
    dirs: HashMap<u64, Walk>,
}

struct Walk {
    last: Instant,
    /// The window of the last read-ahead (0: none yet).
    window: usize,
}

impl Walks {
    /// A name of directory `parent` was read from the cluster: how many
    /// names to read ahead from it (None: not a walk, yet).
    pub(super) fn missed(&mut self, parent: u64) -> Option<usize> {
        let now = Instant::now();
        if self.dirs.len() > 4096 {
            self.dirs
                .retain(|_, w| now.duration_since(w.last) < WALK_GAP);
        }
        let walk = self.dirs.entry(parent).or_insert(Walk {
            last: now - 2 * WALK_GAP,
            window: 0,
        });
        let walking = now.duration_since(walk.last) < WALK_GAP;
        walk.last = now;
        if !walking {
            walk.window = 0;
            return None;
        }
        walk.window = (walk.window * 2).clamp(WINDOW_MIN, WINDOW_MAX);
        Some(walk.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_miss_soon_after_starts_a_window_that_doubles() {
        let mut w = Walks::default();
        assert_eq!(w.missed(7), None, "one lookup is not a walk");
        assert_eq!(w.missed(7), Some(WINDOW_MIN));
        assert_eq!(w.missed(7), Some(2 * WINDOW_MIN));
        assert_eq!(w.missed(9), None, "per directory");
        for _ in 0..10 {
            w.missed(7);
        }
        assert_eq!(w.missed(7), Some(WINDOW_MAX));
    }

    #[test]
    fn a_pause_ends_the_walk() {
        let mut w = Walks::default();
        w.missed(7);
        assert_eq!(w.missed(7), Some(WINDOW_MIN));
        w.dirs.get_mut(&7).unwrap().last -= WALK_GAP;
        assert_eq!(w.missed(7), None);
        assert_eq!(w.missed(7), Some(WINDOW_MIN), "a new walk starts small");
    }
}
