//! What the guide leaves open: the half-done change of a holder that died.
//!
//! Every rename first writes an *intent* document (in the `locks` index)
//! describing the whole change; then it performs the change as idempotent
//! steps; then it deletes the intent. If the mount dies in between, its
//! session lease lapses, and the next mount to look (at start, every few
//! seconds in the background, or `esfs fsck --repair`) takes the intent
//! over, takes the same tree locks (breaking the dead owner's), and runs the
//! same steps again: the rename is rolled forward, so the tree ends as if it
//! had finished, with nothing lost or duplicated. Link counts are recounted
//! rather than adjusted, and paths are recomputed from the parent chain, so
//! running a step twice changes nothing.
//!
//! One exception: on a store that applies a bulk all or nothing (the
//! embedded one), a file renamed to a free name is a single bulk, which no
//! crash can split, so it needs no intent (`Fs::move_file_at_once`).

use super::namespace::relink;
use super::*;
use crate::store::{Query, Sort, scan};
use serde::{Deserialize, Serialize};

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

impl Fs {
    pub(super) fn write_intent(&self, intent: &Intent) -> FsResult<String> {
        let id = format!("intent/{}-{}", self.lm.owner(), self.alloc()?);
        let doc = json!({
            "type": "intent", "owner": self.lm.owner(), "since": crate::locks::manager::now_ms(),
            "op": intent,
        });
        self.store.create(Idx::Locks, &id, &doc)?;
        Ok(id)
    }

    pub(super) fn finish_intent(&self, id: &str) -> FsResult<()> {
        self.store.delete(Idx::Locks, id, None)?;
        Ok(())
    }

    /// The steps of a move, each a no-op if already done. `entries_done`:
    /// the caller's bulk did steps 1 and 2 (no need to read them back).
    pub(super) fn apply_move(
        &self,
        it: &MoveIntent,
        recovering: bool,
        entries_done: bool,
    ) -> FsResult<()> {
        if !entries_done {
            self.move_entries(it)?;
        }
        self.move_inode(it, recovering)
    }

    /// Steps 1 and 2 of a move: the entries.
    fn move_entries(&self, it: &MoveIntent) -> FsResult<()> {
        let e = &it.entry;
        let new_id = entry_id(e.parent, &decode_bytes(&e.name));
        // 1. The new name points at the moved inode.
        for _ in 0..MAX_RETRIES {
            let r = match self.get_entry(e.parent, &decode_bytes(&e.name))? {
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
        let old = decode_bytes(&it.src_name);
        for _ in 0..MAX_RETRIES {
            match self.get_entry(it.src_parent, &old)? {
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
        Ok(())
    }

    /// Steps 3 to 5 of a move, and the link recount when recovering.
    fn move_inode(&self, it: &MoveIntent, recovering: bool) -> FsResult<()> {
        let e = &it.entry;
        // 3. The inode's back-link follows.
        let now = now_ns();
        self.update_inode(e.ino, |i| {
            relink(i, it.src_parent, &it.src_name, e.parent, &e.name);
            i.ctime_ns = now;
            Ok(())
        })?;
        // 4. The replaced inode loses that name.
        if let Some(r) = it.replaced.filter(|r| *r != e.ino) {
            match self.drop_link(r, e.parent, &e.name) {
                Ok(()) | Err(FsError::NotFound) => {}
                Err(err) => return Err(err),
            }
        }
        // 5. A moved directory's subtree gets its new paths.
        if e.kind == Kind::Dir {
            self.dirs.write().insert(e.ino, (e.parent, e.name.clone()));
            self.rewrite_subtree(&it.old_path, &e.path)?;
        }
        if recovering {
            self.recount_dir(it.src_parent)?;
            self.recount_dir(e.parent)?;
        }
        Ok(())
    }

    pub(super) fn apply_exchange(&self, a: &Entry, b: &Entry) -> FsResult<()> {
        // Each position takes the other's inode and what derives from it
        // (attributes, indexed text, xattr keywords).
        let swap = |pos: &Entry, from: &Entry| {
            let mut e = pos.clone();
            e.take_inode_fields(from);
            e
        };
        for (pos, other) in [(a, b), (b, a)] {
            let raw = decode_bytes(&pos.name);
            for _ in 0..MAX_RETRIES {
                let Some((cur, v)) = self.get_entry(pos.parent, &raw)? else {
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
        let now = now_ns();
        for (moved, to) in [(a, b), (b, a)] {
            self.update_inode(moved.ino, |i| {
                relink(i, moved.parent, &moved.name, to.parent, &to.name);
                i.ctime_ns = now;
                Ok(())
            })?;
            if moved.kind == Kind::Dir {
                self.dirs
                    .write()
                    .insert(moved.ino, (to.parent, to.name.clone()));
                self.fix_paths(moved.ino)?;
            }
        }
        self.recount_dir(a.parent)?;
        self.recount_dir(b.parent)
    }

    /// Shared stores (Elasticsearch): a mount that died while other mounts
    /// kept running leaves intents and locks no restart may come back for.
    /// Every lease period, roll forward and release those whose owners'
    /// leases have run out.
    pub fn spawn_janitor(self: &Arc<Self>) {
        if self.cfg.exclusive {
            return; // the only mount recovers at start
        }
        let fs = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("esfs-janitor".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(crate::locks::manager::LEASE);
                    let Some(fs) = fs.upgrade() else { return };
                    match fs.batch(|| fs.reap_dead_mounts()) {
                        Ok((0, 0)) => {}
                        Ok((n, k)) => log::info!(
                            "dead mounts: rolled forward {n} change(s), removed {k} lock(s) and session(s)"
                        ),
                        Err(e) => log::warn!("recovering dead mounts' changes: {e}"),
                    }
                }
            })
            .expect("spawn janitor");
    }

    /// One janitor pass, one listing of the lock documents when nothing is
    /// stale: dead mounts' intents rolled forward, then their sessions and
    /// locks removed (the guide's tree locks would otherwise stay held by a
    /// mount killed hours ago). Returns (intents, locks and sessions).
    pub fn reap_dead_mounts(&self) -> FsResult<(usize, u64)> {
        let docs = LockManager::list(&*self.store)?;
        if self.lm.reap_dead(&docs, false)?.problems.is_empty() {
            return Ok((0, 0));
        }
        let rolled = self.recover_intents()?;
        let docs = LockManager::list(&*self.store)?;
        Ok((rolled, self.lm.reap_dead(&docs, true)?.repaired))
    }

    /// Roll forward the intents of dead mounts (all of them on an exclusive
    /// store, whose only other writer was this mount's previous life).
    pub fn recover_intents(&self) -> FsResult<usize> {
        let mut found = Vec::new();
        scan(
            &*self.store,
            Idx::Locks,
            Query::term("type", "intent"),
            vec![Sort::asc("since")],
            100,
            |hits| {
                found.extend(hits.into_iter().map(|h| h.doc));
                Ok(true)
            },
        )?;
        let mut done = 0;
        for doc in found {
            let owner = doc.source["owner"].as_str().unwrap_or("").to_string();
            if owner == self.lm.owner() || (!self.cfg.exclusive && self.lm.alive(&owner)?) {
                continue;
            }
            // Take the intent over; if another mount was faster, leave it.
            let mut mine = doc.source.clone();
            mine["owner"] = json!(self.lm.owner());
            match self
                .store
                .put(Idx::Locks, &doc.id, &mine, Some(doc.version))
            {
                Ok(_) => {}
                Err(StoreError::Conflict(_)) | Err(StoreError::NotFound(_)) => continue,
                Err(e) => return Err(e.into()),
            }
            let intent: Intent = serde_json::from_value(doc.source["op"].clone())?;
            log::warn!("rolling forward {} left by {owner}: {intent:?}", doc.id);
            self.redo(&intent)?;
            self.finish_intent(&doc.id)?;
            done += 1;
        }
        Ok(done)
    }

    fn redo(&self, intent: &Intent) -> FsResult<()> {
        // The change is ours now: take its locks like the dead owner did.
        let _g = self.locks.exclusive();
        self.store.refresh(Idx::Entries)?;
        match intent {
            Intent::Move(m) => {
                let e = &m.entry;
                let (_t, _) = self.tree_lock(
                    &[m.src_parent, e.parent],
                    &[(m.src_parent, &m.src_name), (e.parent, &e.name)],
                )?;
                self.apply_move(m, true, false)
            }
            Intent::Exchange { a, b } => {
                let (_t, _) = self.tree_lock(
                    &[a.parent, b.parent],
                    &[(a.parent, &a.name), (b.parent, &b.name)],
                )?;
                self.apply_exchange(a, b)
            }
        }
    }

    /// Set an inode's link count and back-links (fsck repair).
    pub fn set_links(&self, ino: u64, nlink: u32, links: Vec<Link>) -> FsResult<()> {
        self.update_inode(ino, |i| {
            i.nlink = nlink;
            if ino != ROOT_INO {
                i.links = links.clone();
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Directory link count from the truth: 2 + its subdirectories.
    pub fn recount_dir(&self, ino: u64) -> FsResult<()> {
        let subdirs = self.store.count(
            Idx::Entries,
            &Query::and(vec![Query::term("parent", ino), Query::term("kind", "dir")]),
        )?;
        let now = now_ns();
        match self.update_inode(ino, |i| {
            i.nlink = 2 + subdirs as u32;
            i.mtime_ns = now;
            i.ctime_ns = now;
            Ok(())
        }) {
            Ok(_) | Err(FsError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Recompute `path`/`dir` of every entry below directory `ino` from the
    /// parent chain (the truth), walking by inode. Returns how many changed.
    pub fn fix_paths(&self, ino: u64) -> FsResult<u64> {
        let mut fixed = 0;
        let mut queue = vec![ino];
        while let Some(dir) = queue.pop() {
            let dpath = self.dir_path(dir)?;
            let mut stale = Vec::new();
            scan(
                &*self.store,
                Idx::Entries,
                Query::term("parent", dir),
                vec![Sort::asc("cookie")],
                1000,
                |hits| {
                    for h in hits {
                        let e: Entry = serde_json::from_value(h.doc.source)
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
            for id in stale {
                for _ in 0..MAX_RETRIES {
                    let Some(doc) = self.store.get(Idx::Entries, &id)? else {
                        break;
                    };
                    let mut e: Entry = serde_json::from_value(doc.source)?;
                    e.dir = dpath.clone();
                    e.path = join_path(&dpath, &e.name);
                    match self
                        .store
                        .put(Idx::Entries, &id, &to_doc(&e), Some(doc.version))
                    {
                        Ok(_) => {
                            fixed += 1;
                            break;
                        }
                        Err(StoreError::Conflict(_)) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
            }
        }
        Ok(fixed)
    }
}
