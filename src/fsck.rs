//! `esfs fsck`: check (and with `--repair`, restore) the invariants of the
//! document model. Safe while mounts are live: it only rolls forward the
//! intents of dead mounts and breaks locks whose owners are dead.
//!
//! Invariants:
//! - every entry's parent exists and is a directory, and its inode exists;
//! - `path`/`dir` of every entry match the parent chain (no stale subtree
//!   paths) and no two entries share a path;
//! - a file's nlink equals its number of names, and its back-links are
//!   exactly those names; a directory's nlink is 2 + its subdirectories;
//! - every inode but the root has a name, unless it is open somewhere
//!   (orphan) on a live mount; every content key belongs to an inode;
//! - no lock, intent or session of a dead mount is left;
//! - no file's stored size or mtime lags its contents (a mount killed
//!   right after a close, before its write-back: its unflushed journal names
//!   the files; the next mount would also catch them up).

use crate::data::DataStore;
use crate::error::FsResult;
use crate::fs::Fs;
use crate::locks::LockManager;
use crate::model::*;
use crate::store::{Idx, MetaStore, Query, Sort, StoreError, scan};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

#[derive(Debug, Default)]
pub(crate) struct Report {
    pub entries: u64,
    pub inodes: u64,
    /// Problems found (before any repair).
    pub problems: Vec<String>,
    pub repaired: u64,
}

impl Report {
    /// fsck's exit status: 0 clean, 1 errors corrected, 4 errors left.
    pub(crate) fn exit_code(&self, repair: bool) -> i32 {
        match (self.problems.is_empty(), repair) {
            (true, _) => 0,
            (false, true) => 1,
            (false, false) => 4,
        }
    }
}

/// Periodic progress on stderr (a large store takes minutes to check).
fn progress(what: &str, n: u64) {
    if n.is_multiple_of(10_000) && n > 0 {
        eprintln!("fsck: {n} {what} read...");
    }
}

/// Checks every invariant; with `repair`, restores them. The checks all run
/// on what they read first, then the repairs follow in a fixed order: dead
/// mounts' intents and locks, entries, link counts, unowned contents,
/// unflushed sizes.
pub(crate) fn fsck(
    fs: &Fs,
    store: &Arc<dyn MetaStore>,
    data: &Arc<dyn DataStore>,
    repair: bool,
    unflushed: Option<&std::path::Path>,
) -> FsResult<Report> {
    let mut c = Checker {
        fs,
        store,
        data,
        r: Report::default(),
    };
    c.announce(repair)?;
    let live_sessions = c.dead_mounts(repair)?;
    let inodes = c.read_inodes()?;
    let entries = c.read_entries()?;
    let tree = c.check_entries(&inodes, &entries);
    let links = c.check_links(&inodes, &tree, live_sessions);
    let orphan_data = c.check_contents(&inodes)?;
    let orphan_texts = c.check_texts(&inodes)?;
    let behind = c.check_unflushed(unflushed)?;
    // Object storage: orphan and missing blocks (repaired at once: the
    // store knows what it may delete).
    let audit = data.audit(repair)?;
    c.r.problems.extend(audit.problems);
    c.r.repaired += audit.repaired;
    if repair {
        c.repair_entries(&tree)?;
        c.repair_links(links)?;
        c.repair_contents(orphan_data)?;
        c.repair_texts(orphan_texts)?;
        c.repair_unflushed(behind)?;
    }
    Ok(c.r)
}

/// One run of fsck: what it checks, and the report it fills.
struct Checker<'a> {
    fs: &'a Fs,
    store: &'a Arc<dyn MetaStore>,
    data: &'a Arc<dyn DataStore>,
    r: Report,
}

/// What the entries say about the tree.
#[derive(Default)]
struct Tree {
    /// Each inode's names, as the entries give them.
    names: HashMap<u64, Vec<Link>>,
    /// Each directory's number of subdirectories.
    subdirs: HashMap<u64, u32>,
    /// Entries whose parent or inode is missing (or whose parent is no
    /// directory): deleted by repair.
    dangling: Vec<String>,
    /// Some entry's path does not match its parent chain, or two share one.
    stale_paths: bool,
}

/// Inodes whose link counts or back-links are wrong, and inodes no entry
/// names.
struct Links {
    /// Inode -> the nlink and back-links it should have.
    relink: BTreeMap<u64, (u32, Vec<Link>)>,
    unreferenced: Vec<Inode>,
}

/// Paths of directories, from the inodes' parent links (memoized; `None`
/// for a broken or looping chain).
fn path_of(
    ino: u64,
    inodes: &HashMap<u64, Inode>,
    memo: &mut HashMap<u64, Option<String>>,
    depth: u32,
) -> Option<String> {
    if ino == ROOT_INO {
        return Some("/".into());
    }
    if let Some(p) = memo.get(&ino) {
        return p.clone();
    }
    let i = inodes.get(&ino)?;
    let l = i.links.first()?;
    let p = if depth > 4096 {
        None
    } else {
        path_of(l.p, inodes, memo, depth + 1).map(|pp| join_path(&pp, &l.n))
    };
    memo.insert(ino, p.clone());
    p
}

/// Back-links in one order, for comparing.
fn sorted_links(mut links: Vec<Link>) -> Vec<Link> {
    links.sort_by(|x, y| (x.p, &x.n).cmp(&(y.p, &y.n)));
    links
}

impl Checker<'_> {
    fn announce(&self, repair: bool) -> FsResult<()> {
        self.store.refresh(Idx::Entries)?;
        self.store.refresh(Idx::Inodes)?;
        let n_inodes = self.store.count(Idx::Inodes, &Query::MatchAll)?;
        let n_entries = self.store.count(Idx::Entries, &Query::MatchAll)?;
        eprintln!(
            "fsck: checking {n_inodes} inodes and {n_entries} entries{}...",
            if repair { " (repair)" } else { "" }
        );
        Ok(())
    }

    /// Locks, intents and sessions of dead mounts. Repair rolls the intents
    /// forward first: their owners' locks guard the half-done renames.
    /// Returns the number of live sessions.
    fn dead_mounts(&mut self, repair: bool) -> FsResult<usize> {
        let lm = self.fs.lock_manager();
        let found = lm.reap_dead(&LockManager::list(&**self.store)?, false)?;
        self.r.problems.extend(found.problems);
        if repair {
            self.r.repaired += self.fs.recover_intents()? as u64;
            let locks = LockManager::list(&**self.store)?;
            self.r.repaired += lm.reap_dead(&locks, true)?.repaired;
        }
        Ok(found.live_sessions)
    }

    fn read_inodes(&mut self) -> FsResult<HashMap<u64, Inode>> {
        let mut inodes = HashMap::new();
        let r = &mut self.r;
        scan(
            &**self.store,
            Idx::Inodes,
            Query::MatchAll,
            vec![],
            1000,
            |hits| {
                for h in hits {
                    match h.doc.parse::<Inode>() {
                        Ok(i) => {
                            inodes.insert(i.ino, i);
                        }
                        Err(e) => {
                            return Err(StoreError::Other(format!("inode {}: {e}", h.doc.id)));
                        }
                    }
                    r.inodes += 1;
                    progress("inodes", r.inodes);
                }
                Ok(true)
            },
        )?;
        Ok(inodes)
    }

    fn read_entries(&mut self) -> FsResult<Vec<(String, Entry)>> {
        let mut entries = Vec::new();
        let r = &mut self.r;
        scan(
            &**self.store,
            Idx::Entries,
            Query::MatchAll,
            // Straight from the embedded store's (parent, cookie) index.
            vec![Sort::asc("parent"), Sort::asc("cookie")],
            1000,
            |hits| {
                for h in hits {
                    match h.doc.parse::<Entry>() {
                        Ok(e) => entries.push((h.doc.id, e)),
                        Err(e) => {
                            return Err(StoreError::Other(format!("entry {}: {e}", h.doc.id)));
                        }
                    }
                    r.entries += 1;
                    progress("entries", r.entries);
                }
                Ok(true)
            },
        )?;
        Ok(entries)
    }

    /// Every entry's parent is a directory and its inode exists; its path
    /// matches the parent chain, and is nobody else's.
    fn check_entries(&mut self, inodes: &HashMap<u64, Inode>, entries: &[(String, Entry)]) -> Tree {
        let mut t = Tree::default();
        let mut dir_paths: HashMap<u64, Option<String>> = HashMap::new();
        let mut seen_paths: HashSet<String> = HashSet::new();
        for (id, e) in entries {
            if let Some(problem) = self.dangling(inodes, e) {
                self.r.problems.push(format!("entry {id}: {problem}"));
                t.dangling.push(id.clone());
                continue;
            }
            t.names.entry(e.ino).or_default().push(Link {
                p: e.parent,
                n: e.name.clone(),
            });
            if e.kind == Kind::Dir {
                *t.subdirs.entry(e.parent).or_default() += 1;
            }
            match path_of(e.parent, inodes, &mut dir_paths, 0) {
                Some(dp) if e.dir == dp && e.path == join_path(&dp, &e.name) => {}
                Some(dp) => {
                    self.r.problems.push(format!(
                        "entry {id}: path {:?} should be {:?}",
                        e.path,
                        join_path(&dp, &e.name)
                    ));
                    t.stale_paths = true;
                }
                None => self.r.problems.push(format!(
                    "entry {id}: parent chain of {} is broken",
                    e.parent
                )),
            }
            if !seen_paths.insert(e.path.clone()) {
                self.r.problems.push(format!("duplicate path {:?}", e.path));
                t.stale_paths = true;
            }
        }
        t
    }

    /// Why an entry points nowhere, if it does.
    fn dangling(&self, inodes: &HashMap<u64, Inode>, e: &Entry) -> Option<String> {
        match inodes.get(&e.parent) {
            Some(p) if p.kind == Kind::Dir => {}
            Some(_) => return Some(format!("parent {} is not a directory", e.parent)),
            None => return Some(format!("parent {} does not exist", e.parent)),
        }
        if !inodes.contains_key(&e.ino) {
            return Some(format!("inode {} does not exist", e.ino));
        }
        None
    }

    /// Link counts and back-links; unreferenced inodes.
    fn check_links(
        &mut self,
        inodes: &HashMap<u64, Inode>,
        tree: &Tree,
        live_sessions: usize,
    ) -> Links {
        let mut relink = BTreeMap::new();
        let mut unreferenced = Vec::new();
        for (ino, i) in inodes {
            let have = tree.names.get(ino).cloned().unwrap_or_default();
            if *ino == ROOT_INO {
                continue;
            }
            if have.is_empty() {
                if i.orphan && live_sessions > 0 {
                    continue; // unlinked but maybe open on a live mount
                }
                let why = if i.orphan {
                    " (orphan of a dead mount)"
                } else {
                    ""
                };
                self.r
                    .problems
                    .push(format!("inode {ino} has no name{why}"));
                unreferenced.push(i.clone());
                continue;
            }
            let want = if i.kind == Kind::Dir {
                2 + tree.subdirs.get(ino).copied().unwrap_or(0)
            } else {
                have.len() as u32
            };
            let a = sorted_links(i.links.clone());
            let b = sorted_links(have);
            if i.nlink != want || a != b {
                self.r.problems.push(format!(
                    "inode {ino}: nlink {} / {} back-links, should be {want} / {}",
                    i.nlink,
                    i.links.len(),
                    b.len()
                ));
                relink.insert(*ino, (want, b));
            }
        }
        if let Some(root) = inodes.get(&ROOT_INO) {
            let want = 2 + tree.subdirs.get(&ROOT_INO).copied().unwrap_or(0);
            if root.nlink != want {
                self.r
                    .problems
                    .push(format!("root: nlink {}, should be {want}", root.nlink));
                relink.insert(ROOT_INO, (want, vec![]));
            }
        }
        Links {
            relink,
            unreferenced,
        }
    }

    /// Contents nobody owns: their keys.
    fn check_contents(&mut self, inodes: &HashMap<u64, Inode>) -> FsResult<Vec<String>> {
        let keys: HashSet<String> = inodes.values().filter_map(|i| i.content.clone()).collect();
        let orphan_data: Vec<String> = self
            .data
            .keys()?
            .into_iter()
            .filter(|k| !keys.contains(k))
            .collect();
        for k in &orphan_data {
            self.r
                .problems
                .push(format!("contents {k} belong to no inode"));
        }
        Ok(orphan_data)
    }

    /// Texts (for search) of inodes that are gone or no regular file: their
    /// inode numbers. (A file removed while its text was being written.)
    fn check_texts(&mut self, inodes: &HashMap<u64, Inode>) -> FsResult<Vec<u64>> {
        let orphans: Vec<u64> = crate::search::text_inos(&**self.store, &Query::MatchAll)?
            .into_iter()
            .filter(|i| inodes.get(i).is_none_or(|i| i.kind != Kind::File))
            .collect();
        for ino in &orphans {
            self.r
                .problems
                .push(format!("text of inode {ino} belongs to no file"));
        }
        Ok(orphans)
    }

    /// Sizes a killed mount had not written back yet (the inodes its
    /// unflushed journal names): (inode, size, mtime) as the data has them.
    fn check_unflushed(
        &mut self,
        unflushed: Option<&std::path::Path>,
    ) -> FsResult<Vec<(u64, u64, i64)>> {
        let mut behind = Vec::new();
        let Some(path) = unflushed else {
            return Ok(behind);
        };
        let inos = crate::fs::journal::Journal::read(path)
            .map_err(|e| crate::error::FsError::Io(format!("{}: {e}", path.display())))?;
        for ino in inos {
            if let Some((len, mtime)) = self.fs.behind_data(ino)? {
                self.r.problems.push(format!(
                    "inode {ino}: stored size/mtime lag its contents ({len} bytes): \
                     its mount died before writing them back"
                ));
                behind.push((ino, len, mtime));
            }
        }
        Ok(behind)
    }

    fn repair_entries(&mut self, tree: &Tree) -> FsResult<()> {
        for id in &tree.dangling {
            self.store.delete(Idx::Entries, id, None)?;
            self.r.repaired += 1;
        }
        if tree.stale_paths {
            self.r.repaired += self.fs.fix_paths(ROOT_INO)?;
        }
        Ok(())
    }

    fn repair_links(&mut self, links: Links) -> FsResult<()> {
        for (ino, (nlink, l)) in links.relink {
            self.fs.set_links(ino, nlink, l)?;
            self.r.repaired += 1;
        }
        for i in links.unreferenced {
            if let Some(k) = &i.content {
                self.data.remove(k)?;
            }
            self.store.delete(Idx::Texts, &text_id(i.ino), None)?;
            self.store.delete(Idx::Inodes, &inode_id(i.ino), None)?;
            self.r.repaired += 1;
        }
        Ok(())
    }

    fn repair_contents(&mut self, orphan_data: Vec<String>) -> FsResult<()> {
        for k in orphan_data {
            self.data.remove(&k)?;
            self.r.repaired += 1;
        }
        Ok(())
    }

    /// Deletes the texts `check_texts` found, each unless its inode is a
    /// file by now (made and indexed since the inodes were read).
    fn repair_texts(&mut self, orphans: Vec<u64>) -> FsResult<()> {
        for ino in orphans {
            let file = self
                .store
                .get(Idx::Inodes, &inode_id(ino))?
                .and_then(|d| d.parse::<Inode>().ok())
                .is_some_and(|i| i.kind == Kind::File);
            if !file && self.store.delete(Idx::Texts, &text_id(ino), None)? {
                self.r.repaired += 1;
            }
        }
        Ok(())
    }

    fn repair_unflushed(&mut self, behind: Vec<(u64, u64, i64)>) -> FsResult<()> {
        for (ino, len, mtime) in behind {
            self.fs.catch_up_with_data(ino, len, mtime)?;
            self.r.repaired += 1;
        }
        Ok(())
    }
}
