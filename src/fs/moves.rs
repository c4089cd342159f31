//! The plan of a rename and the only copy of the idempotent steps that
//! carry it out, run by the live rename (`ops/rename.rs`), by the
//! roll-forward of a dead mount's intent (`super::intent`) and, for paths,
//! by `esfs fsck --repair`. Each step is a no-op where it is done already:
//! - entries: the new name points at the moved inode and the old name goes
//!   (`move_entries`); in an exchange each name takes the other's inode
//!   (`exchange_entries`);
//! - link: the inode's back-link, and a directory's cached place, follow
//!   the name (`move_link`);
//! - the inode a move replaces loses that name (`OpenFiles::drop_link`);
//! - paths: the entries below a moved directory get its new path, by
//!   prefix where the state is known (`rebase_paths`: a move, or the live
//!   exchange), else from the parent chain, the truth (`fix_paths`: an
//!   exchange rolled forward, fsck);
//! - counts: the live rename adjusts its parents' link counts and times
//!   itself (`Tree::touch`); a roll-forward recounts them (`Tree::recount`).
//!
//! Link counts are recounted rather than adjusted, and paths are recomputed
//! from the parent chain, so running a step twice changes nothing.
//!
//! The live rename passes the versions of the entries it read under its
//! locks, and the moved files' inodes: its entry writes and those inodes'
//! back-links are then one bulk conditional on them, and a conflict (a
//! concurrent attribute or text refresh) falls back to the re-reading way a
//! roll-forward takes.
//!
//! One exception, not a step: on a store that applies a bulk all or nothing
//! (the embedded one), a file renamed to a free name does the entries and
//! the link in a single bulk, which no crash can split, so it needs no
//! intent (`Moves::move_at_once`).

use super::docs::{Docs, MAX_RETRIES, bulk_check, to_doc};
use super::files::OpenFiles;
use super::ids::Ids;
use super::tree::Tree;
use crate::error::{FsError, FsResult};
use crate::model::{Entry, Inode, Kind, Link, decode_bytes, entry_id, inode_id, join_path, now_ns};
use crate::store::{
    BulkItemResult, BulkOp, Idx, MetaStore, Query, Sort, StoreError, StoreResult, Version, scan,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

/// Documents per page of a directory rename's path step: each page is one
/// search and one bulk, and a bulk's fixed cost (a translog fsync on every
/// shard copy, a round trip to each replica) is paid per request, so larger
/// pages move a 100k-file tree about twice as fast as pages of 1000 on a
/// three-node cluster with replicas (docs/cluster.md). Bounded by the
/// indices' `max_result_window` (10000); 5000 partial updates of `path` and
/// `dir` are well under a megabyte.
const REBASE_PAGE: usize = 5000;

/// Pages of a directory rename's path step sent at once: while the
/// cluster's primary applies one, the replicas apply the one before and
/// the next is read. Sent one after another, a 100k-file rename on three
/// nodes waited on each page's round trip through primary and replica in
/// turn, with the nodes' CPU 60% busy (docs/cluster.md).
const REBASE_IN_FLIGHT: usize = 3;

/// The answer of a page's bulk sent on its own thread.
fn joined<T>(page: Option<std::thread::ScopedJoinHandle<'_, StoreResult<T>>>) -> StoreResult<T> {
    let page = page.expect("a page in flight");
    page.join()
        .unwrap_or_else(|_| Err(StoreError::Other("a rename page's bulk panicked".into())))
}

/// A rename (without exchange) in progress.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MoveIntent {
    pub src_parent: u64,
    /// Encoded name.
    pub src_name: String,
    pub old_path: String,
    /// The new entry, complete (parent, name, path, ino, kind, cookie...).
    pub entry: Entry,
    /// The inode the target name pointed to before, if any.
    pub replaced: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Intent {
    Move(MoveIntent),
    /// RENAME_EXCHANGE of the two entries (as they were before).
    Exchange {
        a: Entry,
        b: Entry,
    },
}

/// What the live rename read under its locks: the entries' versions
/// (`V`), and the moved inodes, with versions (a directory's only where
/// no deferred times of its wait in memory for its own write to take).
pub(super) struct Seen<V> {
    pub(super) entries: V,
    pub(super) inodes: Vec<(Inode, Version)>,
    /// Further writes for the entries' bulk, conditional on what was read
    /// (the parents' touches); `apply_move` says which succeeded.
    pub(super) also: Vec<BulkOp>,
}

/// What the live rename's bulk did besides the entries.
#[derive(Default)]
struct Bulked {
    /// The inodes whose back-links it moved.
    linked: Vec<u64>,
    /// Which of `Seen::also` succeeded.
    also: Vec<bool>,
}

pub(super) struct Moves {
    store: Arc<dyn MetaStore>,
    docs: Arc<Docs>,
    /// Directories' places follow their moves; parents are recounted.
    tree: Arc<Tree>,
    /// A replaced inode loses its name there (deleted unless in use).
    files: Arc<OpenFiles>,
    ids: Arc<Ids>,
    /// The store applies a bulk all or nothing (see `move_at_once`).
    atomic_bulk: bool,
}

impl Moves {
    pub(super) fn new(
        store: Arc<dyn MetaStore>,
        docs: Arc<Docs>,
        tree: Arc<Tree>,
        files: Arc<OpenFiles>,
        ids: Arc<Ids>,
    ) -> Moves {
        Moves {
            atomic_bulk: store.capabilities().atomic_bulk,
            store,
            docs,
            tree,
            files,
            ids,
        }
    }

    /// A move's steps. `seen`: the live rename's versions of the old entry
    /// and of the entry the new name replaces (None: the name was free),
    /// and a moved file's inode, read under the locks it holds. None: a
    /// roll-forward, which also recounts the parents' links (the live
    /// rename adjusts them itself). Returns which of `seen.also` succeeded.
    pub(super) fn apply_move(
        &self,
        it: &MoveIntent,
        seen: Option<&Seen<(Version, Option<Version>)>>,
    ) -> FsResult<Vec<bool>> {
        let e = &it.entry;
        // 1, 2. The new name points at the moved inode, the old one no
        // longer (with the live rename, 3 too, in the same bulk).
        let bulked = self.move_entries(it, seen)?;
        // 3. The inode's back-link follows (a directory's cached parent too).
        if bulked.linked.contains(&e.ino) {
            if e.kind == Kind::Dir {
                self.tree.placed(e.ino, e.parent, &e.name);
            }
        } else {
            self.move_link(
                e.ino,
                e.kind,
                (it.src_parent, &it.src_name),
                (e.parent, &e.name),
                now_ns(),
            )?;
        }
        // 4. The replaced inode loses that name.
        if let Some(r) = it.replaced.filter(|r| *r != e.ino) {
            match self.files.drop_replaced_link(r, e.parent, &e.name) {
                Ok(()) | Err(FsError::NotFound) => {}
                Err(err) => return Err(err),
            }
        }
        // 5. A moved directory's subtree gets its new paths. By prefix even
        // when rolling forward: nothing but the moved subtree can be below
        // the old name while the rename's tree locks hold it.
        if e.kind == Kind::Dir {
            self.rebase_paths(&it.old_path, &e.path)?;
        }
        if seen.is_none() {
            self.tree.recount(it.src_parent)?;
            self.tree.recount(e.parent)?;
        }
        Ok(bulked.also)
    }

    /// Steps 1 and 2 of a move: the entries. With `seen` (the live
    /// rename), first both in one bulk conditional on those versions, with
    /// the seen inode's back-link (step 3) and `also` (other shards, so in
    /// no order with the entries: the intent covers a crash). If the bulk's
    /// first item failed nothing happened to the entries, if the second
    /// failed the new name is there: either way the re-reading steps below
    /// complete them.
    fn move_entries(
        &self,
        it: &MoveIntent,
        seen: Option<&Seen<(Version, Option<Version>)>>,
    ) -> FsResult<Bulked> {
        let e = &it.entry;
        let new_id = entry_id(e.parent, &decode_bytes(&e.name));
        let old = decode_bytes(&it.src_name);
        let mut bulked = Bulked::default();
        if let Some(Seen {
            entries: (sver, dver),
            inodes,
            also,
        }) = seen
        {
            let put_new = match *dver {
                Some(v) => BulkOp::Index {
                    index: Idx::Entries,
                    id: new_id.clone(),
                    source: to_doc(e),
                    if_version: Some(v),
                },
                None => BulkOp::Create {
                    index: Idx::Entries,
                    id: new_id.clone(),
                    source: to_doc(e),
                },
            };
            let mut ops = vec![
                put_new,
                BulkOp::Delete {
                    index: Idx::Entries,
                    id: entry_id(it.src_parent, &old),
                    if_version: Some(*sver),
                },
            ];
            let now = now_ns();
            ops.extend(
                inodes
                    .iter()
                    .map(|i| link_op(i, (it.src_parent, &it.src_name), (e.parent, &e.name), now)),
            );
            ops.extend(also.iter().cloned());
            let mut res = self.store.bulk(ops)?;
            let also_res = res.split_off(2 + inodes.len());
            bulked.also = also_res.iter().map(|r| r.is_ok()).collect();
            bulked.linked = inode_results(inodes, res.split_off(2));
            match bulk_check(res) {
                Ok(()) => return Ok(bulked),
                Err(err) => log::debug!("rename bulk: {err}; completed by steps"),
            }
        }
        // 1. The new name points at the moved inode.
        for _ in 0..MAX_RETRIES {
            let r = match self.docs.entry(e.parent, &decode_bytes(&e.name))? {
                Some((cur, _)) if cur.ino == e.ino => break,
                Some((_, v)) => self.store.put(Idx::Entries, &new_id, &to_doc(e), Some(v)),
                None => self.store.create(Idx::Entries, &new_id, &to_doc(e)),
            };
            match r {
                Ok(_) => break,
                Err(StoreError::Conflict(_)) => continue,
                Err(err) => return Err(err.into()),
            }
        }
        // 2. The old name no longer does.
        for _ in 0..MAX_RETRIES {
            match self.docs.entry(it.src_parent, &old)? {
                Some((cur, v))
                    if cur.ino == e.ino && (it.src_parent, &it.src_name) != (e.parent, &e.name) =>
                {
                    match self
                        .store
                        .delete(Idx::Entries, &entry_id(it.src_parent, &old), Some(v))
                    {
                        Ok(_) => break,
                        Err(StoreError::Conflict(_)) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
                _ => break,
            }
        }
        Ok(bulked)
    }

    /// The link step (3 of a move; both sides of an exchange): inode `ino`'s
    /// back-link `from` (parent, encoded name) becomes `to`, its ctime
    /// `now`; a directory's cached parent follows.
    fn move_link(
        &self,
        ino: u64,
        kind: Kind,
        from: (u64, &str),
        to: (u64, &str),
        now: i64,
    ) -> FsResult<()> {
        self.docs.update(ino, |i| {
            relink(i, from.0, from.1, to.0, to.1);
            i.ctime_ns = now;
            Ok(())
        })?;
        if kind == Kind::Dir {
            self.tree.placed(ino, to.0, to.1);
        }
        Ok(())
    }

    /// Not a step but steps 1 to 3 at once, instead of the intent and the
    /// steps: a file renamed to a free name, on a store that applies a bulk
    /// all or nothing (the embedded one: one transaction, one redo record).
    /// Both entries and the inode's back-link go in one bulk, which no crash
    /// can split, so no intent is written and deleted (a sixth of a
    /// rename's cost). False: not done (no such store, or a concurrent
    /// change to the entry or inode): the intent's way does it.
    /// `seen`: the moved file's inode, read under the rename's locks.
    pub(super) fn move_at_once(
        &self,
        it: &MoveIntent,
        sver: Version,
        seen: &(Inode, Version),
    ) -> FsResult<bool> {
        if !self.atomic_bulk {
            return Ok(false);
        }
        let e = &it.entry;
        let ops = vec![
            BulkOp::Create {
                index: Idx::Entries,
                id: entry_id(e.parent, &decode_bytes(&e.name)),
                source: to_doc(e),
            },
            BulkOp::Delete {
                index: Idx::Entries,
                id: entry_id(it.src_parent, &decode_bytes(&it.src_name)),
                if_version: Some(sver),
            },
            link_op(
                seen,
                (it.src_parent, &it.src_name),
                (e.parent, &e.name),
                now_ns(),
            ),
        ];
        Ok(self
            .store
            .bulk_atomic(ops)?
            .is_some_and(|results| results.iter().all(|r| r.is_ok())))
    }

    /// An exchange's steps (`a` and `b`: the entries as they were before).
    /// `seen`: the live rename's versions of `a` and `b`, and the inodes of
    /// the files among them, read under the locks it holds. True: its one
    /// bulk swapped the entries (and moved those back-links), so nothing
    /// else of the exchange has happened and the subtrees' paths move by
    /// prefix; the caller adjusts the parents' link counts and times.
    /// False (a roll-forward, or that bulk failed): the state is whatever a
    /// crash or a concurrent refresh left, so paths are recomputed from the
    /// parent chain and the parents' links recounted.
    pub(super) fn apply_exchange(
        &self,
        a: &Entry,
        b: &Entry,
        seen: Option<&Seen<(Version, Version)>>,
    ) -> FsResult<bool> {
        // 1. Each name takes the other's inode (with the live rename, the
        // files' back-links too, in the same bulk).
        let (clean, linked) = self.exchange_entries(a, b, seen)?;
        // 2. Each inode's back-link follows.
        let now = now_ns();
        for (moved, to) in [(a, b), (b, a)] {
            if linked.contains(&moved.ino) {
                continue;
            }
            self.move_link(
                moved.ino,
                moved.kind,
                (moved.parent, &moved.name),
                (to.parent, &to.name),
                now,
            )?;
        }
        // 3. The subtrees' paths.
        if clean {
            match (a.kind == Kind::Dir, b.kind == Kind::Dir) {
                (true, true) => {
                    // Swap through a path no real document can have (a
                    // crash in between is why a roll-forward does not).
                    let tmp = format!("/\0swap{}", self.ids.alloc()?);
                    self.rebase_paths(&a.path, &tmp)?;
                    self.rebase_paths(&b.path, &a.path)?;
                    self.rebase_paths(&tmp, &b.path)?;
                }
                (true, false) => self.rebase_paths(&a.path, &b.path)?,
                (false, true) => self.rebase_paths(&b.path, &a.path)?,
                (false, false) => {}
            }
            return Ok(true);
        }
        for moved in [a, b] {
            if moved.kind == Kind::Dir {
                self.fix_paths(moved.ino)?;
            }
        }
        // 4. The parents' link counts.
        self.tree.recount(a.parent)?;
        self.tree.recount(b.parent)?;
        Ok(false)
    }

    /// Step 1 of an exchange: each position keeps its name, path and
    /// cookie and takes the other's inode and what derives from it
    /// (attributes, indexed text, xattr keywords). With `seen` (the live
    /// rename), first both in one bulk conditional on those versions, with
    /// the seen inodes' back-links: true if that did the entries. Otherwise
    /// (or if it failed) each position is re-read and swapped unless it is
    /// done already. Also returns the inodes whose back-links the bulk moved.
    fn exchange_entries(
        &self,
        a: &Entry,
        b: &Entry,
        seen: Option<&Seen<(Version, Version)>>,
    ) -> FsResult<(bool, Vec<u64>)> {
        let swap = |pos: &Entry, from: &Entry| {
            let mut e = pos.clone();
            e.take_inode_fields(from);
            e
        };
        let mut linked = Vec::new();
        if let Some(Seen {
            entries: (aver, bver),
            inodes,
            also: _,
        }) = seen
        {
            let mut ops: Vec<BulkOp> = [(a, b, *aver), (b, a, *bver)]
                .into_iter()
                .map(|(pos, other, ver)| BulkOp::Index {
                    index: Idx::Entries,
                    id: entry_id(pos.parent, &decode_bytes(&pos.name)),
                    source: to_doc(&swap(pos, other)),
                    if_version: Some(ver),
                })
                .collect();
            let now = now_ns();
            for i in inodes {
                let (from, to) = if i.0.ino == a.ino { (a, b) } else { (b, a) };
                ops.push(link_op(
                    i,
                    (from.parent, &from.name),
                    (to.parent, &to.name),
                    now,
                ));
            }
            let mut res = self.store.bulk(ops)?;
            linked = inode_results(inodes, res.split_off(2));
            match bulk_check(res) {
                Ok(()) => return Ok((true, linked)),
                // A concurrent refresh of either entry (the content indexer).
                Err(err) => log::debug!("exchange bulk: {err}; completed by steps"),
            }
        }
        for (pos, other) in [(a, b), (b, a)] {
            let raw = decode_bytes(&pos.name);
            for _ in 0..MAX_RETRIES {
                let Some((cur, v)) = self.docs.entry(pos.parent, &raw)? else {
                    break;
                };
                if cur.ino != pos.ino {
                    break; // done already
                }
                // A conflict is a concurrent attribute or text refresh: re-read.
                match self.store.put(
                    Idx::Entries,
                    &entry_id(pos.parent, &raw),
                    &to_doc(&swap(pos, other)),
                    Some(v),
                ) {
                    Err(StoreError::Conflict(_)) => continue,
                    r => {
                        r?;
                        break;
                    }
                }
            }
        }
        Ok((false, linked))
    }

    /// The path step by prefix (the directory rename of Elasticsearch: The
    /// Definitive Guide, chapter "Handling Relationships", "Renaming Files and
    /// Directories"): find every document strictly below `old` (one `path.tree` term) and bulk-write
    /// it with its `path` and `dir` below `new`, page by page, checking every
    /// item. A backend that can rewrite the subtree itself (the embedded
    /// store: one SQL statement) does so. Idempotent as long as nothing
    /// but the moved subtree is below `old`.
    fn rebase_paths(&self, old: &str, new: &str) -> FsResult<()> {
        self.docs.see_other_mounts()?;
        // A backend that rewrites the subtree itself does it in one request.
        if self.store.rebase_paths(Idx::Entries, old, new)?.is_some() {
            return Ok(());
        }
        let query = Query::Bool {
            must: vec![Query::tree("path", old)],
            must_not: vec![Query::term("path", old)],
            should: vec![],
        };
        let rebase = |p: &str| format!("{new}{}", &p[old.len()..]);
        // A retry's partial update of `path` and `dir` (see repath_entry).
        let moved = |src: &Value| -> StoreResult<Value> {
            let field = |k: &str| {
                src[k]
                    .as_str()
                    .filter(|p| p.starts_with(old))
                    .map(rebase)
                    .ok_or_else(|| {
                        StoreError::Other(format!("entry without {k} below {old}: {src}"))
                    })
            };
            Ok(json!({"path": field("path")?, "dir": field("dir")?}))
        };
        // A page's documents written whole, conditional on the version the
        // page read: an entry is a few hundred bytes (its text is in
        // `texts`), and a partial update costs Elasticsearch a realtime get
        // of the stored document on the primary before it indexes it again.
        // Whole, 100 000 entries on three nodes moved in 3.6 s of requests
        // against 5.1 (medians, docs/cluster.md). Through `Entry`, so the document is
        // one of today's: a field from an older layout (the text an entry
        // held before the `texts` index) is dropped, not carried.
        let moved_whole = |src: &Value| -> StoreResult<Value> {
            let mut e: Entry = serde_json::from_value(src.clone())
                .map_err(|err| StoreError::Other(format!("entry below {old}: {err}: {src}")))?;
            let fields = moved(src)?;
            e.path = fields["path"].as_str().unwrap_or_default().to_string();
            e.dir = fields["dir"].as_str().unwrap_or_default().to_string();
            Ok(serde_json::to_value(&e).expect("an entry serializes"))
        };
        let mut retry: Vec<String> = Vec::new();
        // Each page's bulk is answered apart from the others: a conflict
        // (changed concurrently, an attribute refresh) is redone alone below.
        let mut answered = |sent: StoreResult<(Vec<String>, Vec<BulkItemResult>)>| {
            let (ids, results) = sent?;
            for (id, r) in ids.into_iter().zip(results) {
                match r {
                    Ok(_) | Err(StoreError::NotFound(_)) => {}
                    Err(StoreError::Conflict(_)) => retry.push(id),
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        };
        // Up to REBASE_IN_FLIGHT pages' bulks at once, the next page read
        // meanwhile. Refreshed just above; each page's bulk rewrites only
        // documents the cursor has passed, so the next page needs no refresh
        // first (scan_brief's searches skip read-your-writes), and pages are
        // disjoint: the order they land in does not matter.
        std::thread::scope(|scope| {
            let mut in_flight = std::collections::VecDeque::new();
            let scanned = crate::store::scan_brief(
                &*self.store,
                Idx::Entries,
                query,
                // Paths are unique, and this order is served by the path index
                // (a second key would force a sort of the whole subtree per page).
                vec![Sort::asc("path")],
                REBASE_PAGE,
                |hits| {
                    let mut ops = Vec::with_capacity(hits.len());
                    for h in hits {
                        ops.push(BulkOp::Index {
                            index: Idx::Entries,
                            source: moved_whole(&h.doc.source)?,
                            id: h.doc.id,
                            if_version: Some(h.doc.version),
                        });
                    }
                    if in_flight.len() == REBASE_IN_FLIGHT {
                        answered(joined(in_flight.pop_front()))?;
                    }
                    let store = &self.store;
                    let ids = ops.iter().map(|op| op.id().to_string()).collect();
                    in_flight.push_back(scope.spawn(move || Ok((ids, store.bulk(ops)?))));
                    Ok(true)
                },
            );
            // Every page sent is answered, even after a failure.
            let mut first = scanned.err();
            for page in in_flight {
                if let Err(e) = answered(joined(Some(page))) {
                    first.get_or_insert(e);
                }
            }
            first.map_or(Ok(()), Err)
        })?;
        self.repath_entries(retry, |src| {
            let path = src["path"].as_str().unwrap_or_default();
            if !(path.starts_with(old) && path.as_bytes().get(old.len()) == Some(&b'/')) {
                return Ok(None); // moved meanwhile
            }
            moved(src).map(Some)
        })?;
        Ok(())
    }

    /// The path step from the truth: recompute `path`/`dir` of every entry
    /// below directory `ino` from the parent chain, walking by inode (for
    /// states a prefix cannot describe: an exchange rolled forward, damage
    /// fsck repairs). Returns how many changed.
    pub(super) fn fix_paths(&self, ino: u64) -> FsResult<u64> {
        // The listing below is a search: see what other mounts finished.
        self.docs.see_other_mounts()?;
        let mut fixed = 0;
        let mut queue = vec![ino];
        while let Some(dir) = queue.pop() {
            let dpath = self.tree.dir_path(dir)?;
            let mut stale = Vec::new();
            scan(
                &*self.store,
                Idx::Entries,
                Query::term("parent", dir),
                vec![Sort::asc("cookie")],
                1000,
                |hits| {
                    for h in hits {
                        let e: Entry = h
                            .doc
                            .parse()
                            .map_err(|e| StoreError::Other(e.to_string()))?;
                        if e.kind == Kind::Dir {
                            queue.push(e.ino);
                        }
                        if e.dir != dpath || e.path != join_path(&dpath, &e.name) {
                            stale.push(h.doc.id);
                        }
                    }
                    Ok(true)
                },
            )?;
            fixed += self.repath_entries(stale, |src| {
                let name = src["name"]
                    .as_str()
                    .ok_or_else(|| StoreError::Other(format!("entry without name: {src}")))?;
                let path = join_path(&dpath, name);
                Ok(
                    (src["dir"] != dpath.as_str() || src["path"] != path.as_str())
                        .then(|| json!({"path": path, "dir": dpath})),
                )
            })?;
        }
        Ok(fixed)
    }

    /// The path step for entries a page could not write as read: each
    /// one's `path` and `dir` become what `want` computes from its current
    /// source (brief: without its text), None if nothing is to change.
    /// Partial updates (the text is neither read nor rewritten), each
    /// conditional on the version read; the conflicts of a round (an
    /// attribute or text refresh meanwhile) are read again together in the
    /// next. In rounds, not one by one: the content indexer rewrites the
    /// entries of a batch of 1024 files at once, so a rename that crossed
    /// it had up to that many conflicts, each a get and a bulk of its own.
    /// Returns how many it wrote; an entry gone meanwhile is left alone.
    fn repath_entries(
        &self,
        mut ids: Vec<String>,
        want: impl Fn(&Value) -> StoreResult<Option<Value>>,
    ) -> FsResult<u64> {
        let mut wrote = 0;
        for _ in 0..=MAX_RETRIES {
            if ids.is_empty() {
                return Ok(wrote);
            }
            let mut conflicts = Vec::new();
            for chunk in ids.chunks(REBASE_PAGE) {
                let keys: Vec<(Idx, String)> =
                    chunk.iter().map(|id| (Idx::Entries, id.clone())).collect();
                let mut ops = Vec::new();
                for (id, doc) in chunk.iter().zip(self.store.mget_docs(&keys, true)?) {
                    let Some(doc) = doc else { continue };
                    if let Some(change) = want(&doc.source)? {
                        ops.push(BulkOp::Update {
                            index: Idx::Entries,
                            id: id.clone(),
                            doc: change,
                            if_version: Some(doc.version),
                        });
                    }
                }
                if ops.is_empty() {
                    continue;
                }
                let sent: Vec<String> = ops.iter().map(|op| op.id().to_string()).collect();
                for (id, r) in sent.into_iter().zip(self.store.bulk(ops)?) {
                    match r {
                        Ok(_) => wrote += 1,
                        Err(StoreError::NotFound(_)) => {}
                        Err(StoreError::Conflict(_)) => conflicts.push(id),
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            ids = conflicts;
        }
        Err(FsError::Again)
    }
}

/// The link step of a file whose inode the live rename read (`seen`), as a
/// bulk item conditional on that read: its back-link `from` becomes `to`,
/// its ctime `now`.
fn link_op(seen: &(Inode, Version), from: (u64, &str), to: (u64, &str), now: i64) -> BulkOp {
    let (mut inode, ver) = seen.clone();
    relink(&mut inode, from.0, from.1, to.0, to.1);
    inode.ctime_ns = now;
    BulkOp::Index {
        index: Idx::Inodes,
        id: inode_id(inode.ino),
        source: to_doc(&inode),
        if_version: Some(ver),
    }
}

/// The inodes whose `link_op`s succeeded (the others: the re-reading step).
fn inode_results(inodes: &[(Inode, Version)], results: Vec<BulkItemResult>) -> Vec<u64> {
    inodes
        .iter()
        .zip(results)
        .filter(|(_, r)| r.is_ok())
        .map(|((i, _), _)| i.ino)
        .collect()
}

/// Replace the back-link (from_p, from_n) of an inode with (to_p, to_n).
/// Idempotent: running it again (crash recovery) changes nothing.
fn relink(i: &mut Inode, from_p: u64, from_n: &str, to_p: u64, to_n: &str) {
    let to = Link {
        p: to_p,
        n: to_n.to_string(),
    };
    let from = i.links.iter().position(|l| l.p == from_p && l.n == from_n);
    let has_to = i.links.contains(&to);
    match (from, has_to) {
        (Some(pos), false) => i.links[pos] = to,
        (Some(pos), true) => {
            i.links.remove(pos);
        }
        (None, false) => i.links.push(to),
        (None, true) => {}
    }
}
