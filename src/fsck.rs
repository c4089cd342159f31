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
pub struct Report {
    pub entries: u64,
    pub inodes: u64,
    /// Problems found (before any repair).
    pub problems: Vec<String>,
    pub repaired: u64,
}

impl Report {
    /// fsck's exit status: 0 clean, 1 errors corrected, 4 errors left.
    pub fn exit_code(&self, repair: bool) -> i32 {
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

pub fn fsck(
    fs: &Fs,
    store: &Arc<dyn MetaStore>,
    data: &Arc<dyn DataStore>,
    repair: bool,
    unflushed: Option<&std::path::Path>,
) -> FsResult<Report> {
    let mut r = Report::default();
    store.refresh(Idx::Entries)?;
    store.refresh(Idx::Inodes)?;
    let n_inodes = store.count(Idx::Inodes, &Query::MatchAll)?;
    let n_entries = store.count(Idx::Entries, &Query::MatchAll)?;
    eprintln!(
        "fsck: checking {n_inodes} inodes and {n_entries} entries{}...",
        if repair { " (repair)" } else { "" }
    );
    let lm = fs.lock_manager();

    // Locks, intents and sessions of dead mounts. Repair rolls the intents
    // forward first: their owners' locks guard the half-done renames.
    let found = lm.reap_dead(&LockManager::list(&**store)?, false)?;
    r.problems.extend(found.problems);
    let live_sessions = found.live_sessions;
    if repair {
        r.repaired += fs.recover_intents()? as u64;
        r.repaired += lm.reap_dead(&LockManager::list(&**store)?, true)?.repaired;
    }

    // Inodes and entries.
    let mut inodes: HashMap<u64, Inode> = HashMap::new();
    scan(
        &**store,
        Idx::Inodes,
        Query::MatchAll,
        vec![],
        1000,
        |hits| {
            for h in hits {
                match serde_json::from_value::<Inode>(h.doc.source) {
                    Ok(i) => {
                        inodes.insert(i.ino, i);
                    }
                    Err(e) => return Err(StoreError::Other(format!("inode {}: {e}", h.doc.id))),
                }
                r.inodes += 1;
                progress("inodes", r.inodes);
            }
            Ok(true)
        },
    )?;
    let mut entries: Vec<(String, Entry)> = Vec::new();
    scan(
        &**store,
        Idx::Entries,
        Query::MatchAll,
        // Straight from the embedded store's (parent, cookie) index.
        vec![Sort::asc("parent"), Sort::asc("cookie")],
        1000,
        |hits| {
            for h in hits {
                match serde_json::from_value::<Entry>(h.doc.source) {
                    Ok(e) => entries.push((h.doc.id, e)),
                    Err(e) => return Err(StoreError::Other(format!("entry {}: {e}", h.doc.id))),
                }
                r.entries += 1;
                progress("entries", r.entries);
            }
            Ok(true)
        },
    )?;

    // Paths of directories, from the inodes' parent links.
    let mut dir_paths: HashMap<u64, Option<String>> = HashMap::new();
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

    let mut names: HashMap<u64, Vec<Link>> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    let mut seen_paths: HashSet<String> = HashSet::new();
    let mut stale_paths = false;
    let mut dangling = Vec::new();
    for (id, e) in &entries {
        match inodes.get(&e.parent) {
            Some(p) if p.kind == Kind::Dir => {}
            Some(_) => {
                r.problems.push(format!(
                    "entry {id}: parent {} is not a directory",
                    e.parent
                ));
                dangling.push(id.clone());
                continue;
            }
            None => {
                r.problems
                    .push(format!("entry {id}: parent {} does not exist", e.parent));
                dangling.push(id.clone());
                continue;
            }
        }
        if !inodes.contains_key(&e.ino) {
            r.problems
                .push(format!("entry {id}: inode {} does not exist", e.ino));
            dangling.push(id.clone());
            continue;
        }
        names.entry(e.ino).or_default().push(Link {
            p: e.parent,
            n: e.name.clone(),
        });
        if e.kind == Kind::Dir {
            *subdirs.entry(e.parent).or_default() += 1;
        }
        match path_of(e.parent, &inodes, &mut dir_paths, 0) {
            Some(dp) if e.dir == dp && e.path == join_path(&dp, &e.name) => {}
            Some(dp) => {
                r.problems.push(format!(
                    "entry {id}: path {:?} should be {:?}",
                    e.path,
                    join_path(&dp, &e.name)
                ));
                stale_paths = true;
            }
            None => r.problems.push(format!(
                "entry {id}: parent chain of {} is broken",
                e.parent
            )),
        }
        if !seen_paths.insert(e.path.clone()) {
            r.problems.push(format!("duplicate path {:?}", e.path));
            stale_paths = true;
        }
    }

    // Link counts and back-links; unreferenced inodes.
    let mut relink: BTreeMap<u64, (u32, Vec<Link>)> = BTreeMap::new();
    let mut unreferenced = Vec::new();
    for (ino, i) in &inodes {
        let have = names.get(ino).cloned().unwrap_or_default();
        if *ino == ROOT_INO {
            continue;
        }
        if have.is_empty() {
            if i.orphan && live_sessions > 0 {
                continue; // unlinked but maybe open on a live mount
            }
            r.problems.push(format!(
                "inode {ino} has no name{}",
                if i.orphan {
                    " (orphan of a dead mount)"
                } else {
                    ""
                }
            ));
            unreferenced.push(i.clone());
            continue;
        }
        let want = if i.kind == Kind::Dir {
            2 + subdirs.get(ino).copied().unwrap_or(0)
        } else {
            have.len() as u32
        };
        let mut a = i.links.clone();
        let mut b = have.clone();
        a.sort_by(|x, y| (x.p, &x.n).cmp(&(y.p, &y.n)));
        b.sort_by(|x, y| (x.p, &x.n).cmp(&(y.p, &y.n)));
        if i.nlink != want || a != b {
            r.problems.push(format!(
                "inode {ino}: nlink {} / {} back-links, should be {want} / {}",
                i.nlink,
                i.links.len(),
                b.len()
            ));
            relink.insert(*ino, (want, b));
        }
    }
    if let Some(root) = inodes.get(&ROOT_INO) {
        let want = 2 + subdirs.get(&ROOT_INO).copied().unwrap_or(0);
        if root.nlink != want {
            r.problems
                .push(format!("root: nlink {}, should be {want}", root.nlink));
            relink.insert(ROOT_INO, (want, vec![]));
        }
    }

    // Contents nobody owns.
    let keys: HashSet<String> = inodes.values().filter_map(|i| i.content.clone()).collect();
    let orphan_data: Vec<String> = data
        .keys()?
        .into_iter()
        .filter(|k| !keys.contains(k))
        .collect();
    for k in &orphan_data {
        r.problems.push(format!("contents {k} belong to no inode"));
    }

    // Sizes a killed mount had not written back yet.
    let mut behind = Vec::new();
    if let Some(path) = unflushed {
        let inos = crate::fs::journal::Journal::read(path)
            .map_err(|e| crate::error::FsError::Io(format!("{}: {e}", path.display())))?;
        for ino in inos {
            if let Some((len, mtime)) = fs.behind_data(ino)? {
                r.problems.push(format!(
                    "inode {ino}: stored size/mtime lag its contents ({len} bytes): \
                     its mount died before writing them back"
                ));
                behind.push((ino, len, mtime));
            }
        }
    }

    if repair {
        for id in &dangling {
            store.delete(Idx::Entries, id, None)?;
            r.repaired += 1;
        }
        if stale_paths {
            r.repaired += fs.fix_paths(ROOT_INO)?;
        }
        for (ino, (nlink, links)) in relink {
            fs.set_links(ino, nlink, links)?;
            r.repaired += 1;
        }
        for i in unreferenced {
            if let Some(k) = &i.content {
                data.remove(k)?;
            }
            store.delete(Idx::Inodes, &inode_id(i.ino), None)?;
            r.repaired += 1;
        }
        for k in orphan_data {
            data.remove(&k)?;
            r.repaired += 1;
        }
        for (ino, len, mtime) in behind {
            fs.catch_up_with_data(ino, len, mtime)?;
            r.repaired += 1;
        }
    }
    Ok(r)
}
