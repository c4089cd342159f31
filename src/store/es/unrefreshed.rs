//! Read-your-writes for searches, per directory: which of an index's
//! documents this client wrote since its last refresh of it.
//!
//! Elasticsearch's searches see a write once the index refreshed (every
//! second, or on demand). A client that wrote an index refreshes it before
//! searching it, so it finds its own writes. An `entries` document's id names
//! its directory (`<parent>/<name>`, fixed for the document's life), so the
//! directories written are known exactly, and a listing of another directory
//! (`parent = P`) cannot match anything written since: it needs no refresh.
//! Other mounts' writes show within the refresh interval either way (the
//! listing bound in docs/consistency.md). Any other query, and any other
//! index, refreshes after any write.

use crate::model::entry_parent;
use crate::store::Query;
use crate::store::schema::Idx;
use std::collections::HashSet;

/// Past this many directories written between two refreshes, every search
/// refreshes (a bound on the set; such a burst refreshes soon anyway).
const MAX_DIRS: usize = 4096;

/// One index's writes since its last refresh.
#[derive(Debug, PartialEq)]
pub(super) enum Unrefreshed {
    /// Nothing: every search sees what this client wrote.
    Clean,
    /// Only `entries` documents of these directories.
    Dirs(HashSet<u64>),
    /// Anything: writes of other kinds, too many directories, a failed
    /// refresh, or (at connect) what was written before this client.
    All,
}

impl Unrefreshed {
    /// Document `id` of `index` was written (or may have been).
    pub(super) fn wrote(&mut self, index: Idx, id: &str) {
        let dir = match index {
            Idx::Entries => entry_parent(id),
            _ => None,
        };
        match (&mut *self, dir) {
            (Unrefreshed::All, _) => {}
            (_, None) => *self = Unrefreshed::All,
            (Unrefreshed::Clean, Some(d)) => *self = Unrefreshed::Dirs(HashSet::from([d])),
            (Unrefreshed::Dirs(dirs), Some(d)) => {
                dirs.insert(d);
                if dirs.len() > MAX_DIRS {
                    *self = Unrefreshed::All;
                }
            }
        }
    }

    /// Whether a search for `query` may miss something written since.
    pub(super) fn hides_from(&self, query: &Query) -> bool {
        match self {
            Unrefreshed::Clean => false,
            Unrefreshed::All => true,
            Unrefreshed::Dirs(dirs) => query.parent_term().is_none_or(|p| dirs.contains(&p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::entry_id;

    fn listing(dir: u64) -> Query {
        Query::term("parent", dir)
    }

    #[test]
    fn a_listing_refreshes_only_for_its_own_directorys_writes() {
        let mut u = Unrefreshed::Clean;
        assert!(!u.hides_from(&listing(5)));
        u.wrote(Idx::Entries, &entry_id(5, b"a"));
        u.wrote(Idx::Entries, &entry_id(9, b"\xff"));
        assert!(u.hides_from(&listing(5)));
        assert!(
            u.hides_from(&listing(9)),
            "a non-UTF-8 name's id names its directory too"
        );
        assert!(!u.hides_from(&listing(6)));
        assert!(
            !u.hides_from(&Query::and(vec![listing(6), Query::term("kind", "dir")])),
            "a conjunction naming the parent"
        );
        assert!(
            u.hides_from(&Query::tree("path.tree", "/a")),
            "any other query"
        );
        assert!(u.hides_from(&Query::term("ino", 3)));
    }

    #[test]
    fn other_indices_and_too_many_directories_refresh_every_search() {
        let mut u = Unrefreshed::Clean;
        u.wrote(Idx::Inodes, "7");
        assert_eq!(u, Unrefreshed::All);
        u.wrote(Idx::Entries, &entry_id(5, b"a"));
        assert!(u.hides_from(&listing(6)), "All stays All");

        let mut u = Unrefreshed::Clean;
        u.wrote(Idx::Entries, "no-parent");
        assert_eq!(u, Unrefreshed::All, "an id that names no directory");

        let mut u = Unrefreshed::Clean;
        for d in 0..=MAX_DIRS as u64 {
            u.wrote(Idx::Entries, &entry_id(d, b"f"));
        }
        assert_eq!(u, Unrefreshed::All);
    }
}
