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
//!
//! A count of a directory's names where this client only removed names
//! since (an `rm -rf`'s rmdir after its unlinks) needs no refresh either:
//! the names it removed are left out by id ([`Unrefreshed::unseen_deletes`]).

use crate::model::entry_parent;
use crate::store::Query;
use crate::store::schema::Idx;
use std::collections::{HashMap, HashSet};

/// Past this many directories written between two refreshes, every search
/// refreshes (a bound on the set; such a burst refreshes soon anyway).
const MAX_DIRS: usize = 4096;
/// Past this many names removed from one directory, its counts refresh (an
/// `ids` clause of that size costs more than the refresh).
const MAX_DELETED: usize = 1024;

/// What this client did to one directory's names since the last refresh.
#[derive(Debug, PartialEq)]
pub(super) enum DirWrites {
    /// Only removed these names (entry ids), each delete acknowledged.
    Deleted(HashSet<String>),
    /// Made, changed, or may have changed some (a write without an answer).
    Changed,
}

/// One index's writes since its last refresh.
#[derive(Debug, PartialEq)]
pub(super) enum Unrefreshed {
    /// Nothing: every search sees what this client wrote.
    Clean,
    /// Only `entries` documents of these directories.
    Dirs(HashMap<u64, DirWrites>),
    /// Anything: writes of other kinds, too many directories, a failed
    /// refresh, or (at connect) what was written before this client.
    All,
}

impl Unrefreshed {
    /// Document `id` of `index` was written (or may have been).
    pub(super) fn wrote(&mut self, index: Idx, id: &str) {
        self.note(index, id, false);
    }

    /// Document `id` of `index` was deleted: the delete was acknowledged.
    pub(super) fn deleted(&mut self, index: Idx, id: &str) {
        self.note(index, id, true);
    }

    fn note(&mut self, index: Idx, id: &str, deleted: bool) {
        let dir = match index {
            Idx::Entries => entry_parent(id),
            _ => None,
        };
        let Some(d) = dir else {
            *self = Unrefreshed::All;
            return;
        };
        if *self == Unrefreshed::Clean {
            *self = Unrefreshed::Dirs(HashMap::new());
        }
        let Unrefreshed::Dirs(dirs) = self else {
            return; // All stays All
        };
        let w = dirs
            .entry(d)
            .or_insert_with(|| DirWrites::Deleted(HashSet::new()));
        match w {
            DirWrites::Deleted(ids) if deleted && ids.len() < MAX_DELETED => {
                ids.insert(id.to_string());
            }
            _ => *w = DirWrites::Changed,
        }
        if dirs.len() > MAX_DIRS {
            *self = Unrefreshed::All;
        }
    }

    /// Whether a search for `query` may miss something written since.
    pub(super) fn hides_from(&self, query: &Query) -> bool {
        match self {
            Unrefreshed::Clean => false,
            Unrefreshed::All => true,
            Unrefreshed::Dirs(dirs) => query.parent_term().is_none_or(|p| dirs.contains_key(&p)),
        }
    }

    /// For a count of `query` without a refresh: the entry ids it must
    /// leave out (names this client removed, still searchable), or None
    /// when only a refresh shows what it wrote. Sound for a directory this
    /// mount holds exclusively: another mount's names there were published
    /// before it let go of its share (see `MetaStore::publish`), and none of
    /// those ids can have been made again since by another mount, which
    /// would have had to share the directory with this mount (a share this
    /// mount gives up publishes, which clears these ids).
    pub(super) fn unseen_deletes(&self, query: &Query) -> Option<Vec<String>> {
        match self {
            Unrefreshed::Clean => Some(Vec::new()),
            Unrefreshed::All => None,
            Unrefreshed::Dirs(dirs) => match dirs.get(&query.parent_term()?) {
                None => Some(Vec::new()),
                Some(DirWrites::Deleted(ids)) => Some(ids.iter().cloned().collect()),
                Some(DirWrites::Changed) => None,
            },
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
    fn a_count_leaves_out_the_names_removed_and_refreshes_after_any_other_write() {
        let mut u = Unrefreshed::Clean;
        assert_eq!(u.unseen_deletes(&listing(5)), Some(vec![]));
        u.deleted(Idx::Entries, &entry_id(5, b"a"));
        assert_eq!(u.unseen_deletes(&listing(5)), Some(vec![entry_id(5, b"a")]));
        assert!(u.hides_from(&listing(5)), "a listing still refreshes");
        assert_eq!(u.unseen_deletes(&listing(6)), Some(vec![]));
        assert_eq!(u.unseen_deletes(&Query::term("ino", 3)), None);
        u.wrote(Idx::Entries, &entry_id(5, b"b"));
        assert_eq!(u.unseen_deletes(&listing(5)), None, "a name made");
        u.deleted(Idx::Entries, &entry_id(5, b"c"));
        assert_eq!(u.unseen_deletes(&listing(5)), None, "made stays made");

        let mut u = Unrefreshed::Clean;
        for i in 0..=MAX_DELETED {
            u.deleted(Idx::Entries, &entry_id(7, format!("f{i}").as_bytes()));
        }
        assert_eq!(u.unseen_deletes(&listing(7)), None, "too many ids");
        u.deleted(Idx::Inodes, "7");
        assert_eq!(u, Unrefreshed::All);
        assert_eq!(u.unseen_deletes(&listing(6)), None);
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
