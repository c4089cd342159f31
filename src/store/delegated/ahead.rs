//! Read-ahead of names for a walk of a directory the overlay cannot hold
//! whole (more than `WHOLE_MAX` names, or its names left memory for the
//! budget): `du`, `ls -l`, `rm -rf` look every name up in listing order,
//! and each miss cost two requests (the entry, then its inode). A second
//! miss in the same directory soon after the first is taken for a walk:
//! the names that follow the missed one in listing (cookie) order are read
//! with their inodes, in a window that doubles while the walk goes on, as
//! a kernel's file read-ahead does. A lone lookup (a build tool's `stat`)
//! reads nothing more.
//!
//! As the kernel's, the window goes on only while the walk is in step
//! with it: the next miss must be the name right after the window (its
//! cookie and id are kept from the read), or one after it if that name
//! is in memory (the walk went past it without a miss: an earlier window
//! or this mount's own write held it). Lookups scattered over a large
//! directory (`esfs search` checking its hits, one name in a thousand)
//! missed every time, and each miss read a window of up to 4096 names and
//! their inodes for nothing: 0.4 s a lookup in a directory of 500 000.

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
    /// The cookie and entry id of the name right after that window (None:
    /// the directory ended within it, or not read yet).
    next: Option<(i64, String)>,
}

impl Walks {
    /// A name of directory `parent`, at `cookie` in its listing, was read
    /// from the cluster: how many names to read ahead from it (None: not a
    /// walk, or not in step with the last window). `held`: whether an
    /// entry (by id) is in memory.
    pub(super) fn missed(
        &mut self,
        parent: u64,
        cookie: i64,
        held: impl FnOnce(&str) -> bool,
    ) -> Option<usize> {
        let now = Instant::now();
        if self.dirs.len() > 4096 {
            self.dirs
                .retain(|_, w| now.duration_since(w.last) < WALK_GAP);
        }
        let walk = self.dirs.entry(parent).or_insert(Walk {
            last: now - 2 * WALK_GAP,
            window: 0,
            next: None,
        });
        let walking = now.duration_since(walk.last) < WALK_GAP;
        walk.last = now;
        let in_step = walk.window == 0
            || walk
                .next
                .as_ref()
                .is_some_and(|(next, id)| cookie == *next || (cookie > *next && held(id)));
        if !walking || !in_step {
            walk.window = 0;
            walk.next = None;
            return None;
        }
        walk.window = (walk.window * 2).clamp(WINDOW_MIN, WINDOW_MAX);
        walk.next = None;
        Some(walk.window)
    }

    /// A read-ahead of directory `parent` ended before entry `id`, at
    /// `cookie`: the walk is in step if that is its next miss.
    pub(super) fn read_up_to(&mut self, parent: u64, cookie: i64, id: &str) {
        if let Some(walk) = self.dirs.get_mut(&parent) {
            walk.next = Some((cookie, id.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> bool {
        false
    }

    #[test]
    fn a_second_miss_soon_after_starts_a_window_that_doubles_while_in_step() {
        let mut w = Walks::default();
        assert_eq!(w.missed(7, 1, none), None, "one lookup is not a walk");
        assert_eq!(w.missed(7, 2, none), Some(WINDOW_MIN));
        w.read_up_to(7, 300, "7/a");
        assert_eq!(w.missed(7, 300, none), Some(2 * WINDOW_MIN));
        assert_eq!(w.missed(9, 5, none), None, "per directory");
        for _ in 0..10 {
            w.read_up_to(7, 1000, "7/b");
            w.missed(7, 1000, none);
        }
        w.read_up_to(7, 9000, "7/c");
        assert_eq!(w.missed(7, 9000, none), Some(WINDOW_MAX));
    }

    #[test]
    fn past_names_in_memory_the_walk_stays_in_step() {
        let mut w = Walks::default();
        w.missed(7, 1, none);
        assert_eq!(w.missed(7, 2, none), Some(WINDOW_MIN));
        w.read_up_to(7, 300, "7/a");
        // The names from 300 on were held already: the walk's next miss
        // is further on.
        assert_eq!(w.missed(7, 520, |id| id == "7/a"), Some(2 * WINDOW_MIN));
    }

    #[test]
    fn a_miss_out_of_step_with_the_window_ends_the_walk() {
        let mut w = Walks::default();
        w.missed(7, 1000, none);
        assert_eq!(w.missed(7, 2000, none), Some(WINDOW_MIN));
        w.read_up_to(7, 2300, "7/a");
        // Scattered lookups: not the name after the window, which the
        // walk did not pass (not in memory), nor one before it.
        assert_eq!(w.missed(7, 5000, none), None);
        assert_eq!(
            w.missed(7, 4000, none),
            Some(WINDOW_MIN),
            "starts small again"
        );
        w.read_up_to(7, 4300, "7/b");
        assert_eq!(w.missed(7, 3000, |_| true), None, "backwards");
        assert_eq!(w.missed(7, 7000, none), Some(WINDOW_MIN));
        assert_eq!(
            w.missed(7, 8000, none),
            None,
            "the window's end not known: out of step"
        );
    }

    #[test]
    fn a_pause_ends_the_walk() {
        let mut w = Walks::default();
        w.missed(7, 1, none);
        assert_eq!(w.missed(7, 2, none), Some(WINDOW_MIN));
        w.read_up_to(7, 260, "7/a");
        w.dirs.get_mut(&7).unwrap().last -= WALK_GAP;
        assert_eq!(w.missed(7, 260, none), None);
        assert_eq!(
            w.missed(7, 261, none),
            Some(WINDOW_MIN),
            "a new walk starts small"
        );
    }
}
