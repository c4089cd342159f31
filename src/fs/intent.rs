//! The intent: a rename's plan (see [`super::moves`]) written as a lock
//! document before the change, deleted in the request that releases the
//! change's tree locks, and rolled forward by whoever finds its owner dead.
//!
//! Every rename first writes an *intent* document (in the `locks` index)
//! describing the whole change; then it performs the change as idempotent
//! steps; then it deletes the intent. If the mount dies in between, its
//! session lease lapses, and the next mount to look (at start, every lease
//! period in the background, or `esfs fsck --repair`) takes the intent
//! over, takes the same tree locks (breaking the dead owner's), and runs the
//! same steps again: the rename is rolled forward, so the tree ends as if it
//! had finished, with nothing lost or duplicated: the half-done change of a
//! holder that died, which Elasticsearch: The Definitive Guide, chapter
//! "Handling Relationships" ("Solving Concurrency Issues") leaves open. The
//! janitor then removes the dead mounts' sessions and locks (the Definitive
//! Guide's tree locks would otherwise stay held by a mount killed hours ago).

pub use super::moves::{Intent, MoveIntent};

use super::docs::Docs;
use super::ids::Ids;
use super::moves::Moves;
use super::tree::{Tree, TreeLock};
use crate::error::{FsError, FsResult};
use crate::locks::LockManager;
use crate::locks::manager::now_ms;
use crate::model::{Entry, Kind, decode_bytes, join_path};
use crate::store::{BulkOp, Idx, MetaStore, Query, Sort, StoreError, scan};
use serde_json::{Value, json};
use std::sync::Arc;

/// Where a move intent read back stands (see [`Intents::move_state`]).
enum MoveState {
    /// The new name points at the moved inode: carried out, maybe in part.
    Landed,
    /// Nothing done yet, and the names as planned: the old entry (as it is
    /// now) to move.
    Pending(Box<Entry>),
    /// Neither: a plan made from a stale read, never carried out.
    Stale,
}

pub(super) struct Intents {
    store: Arc<dyn MetaStore>,
    docs: Arc<Docs>,
    /// A roll-forward takes the change's locks there.
    tree: Arc<Tree>,
    /// The steps a roll-forward runs again.
    moves: Arc<Moves>,
    ids: Arc<Ids>,
    /// Intents are this mount's lock documents; whose owner is dead, it asks.
    lm: Arc<LockManager>,
    /// The only mount of its store: every intent left is its previous life's.
    single_writer: bool,
}

impl Intents {
    pub(super) fn new(
        store: Arc<dyn MetaStore>,
        docs: Arc<Docs>,
        tree: Arc<Tree>,
        moves: Arc<Moves>,
        ids: Arc<Ids>,
        lm: Arc<LockManager>,
    ) -> Intents {
        Intents {
            single_writer: store.capabilities().single_writer,
            store,
            docs,
            tree,
            moves,
            ids,
            lm,
        }
    }

    pub(super) fn write(&self, intent: &Intent) -> FsResult<String> {
        let id = self.id()?;
        self.store.create(Idx::Locks, &id, &self.doc(intent))?;
        Ok(id)
    }

    /// A new intent's id (this mount's, unique).
    pub(super) fn id(&self) -> FsResult<String> {
        Ok(format!("intent/{}-{}", self.lm.owner(), self.ids.alloc()?))
    }

    /// Intent `id` written (or rewritten) as a bulk item: a put, so the
    /// lock attempts that carry it may send it more than once.
    pub(super) fn op(&self, id: &str, intent: &Intent) -> BulkOp {
        BulkOp::Index {
            index: Idx::Locks,
            id: id.to_string(),
            source: self.doc(intent),
            if_version: None,
        }
    }

    fn doc(&self, intent: &Intent) -> Value {
        json!({
            "type": "intent", "owner": self.lm.owner(), "since": now_ms(),
            "op": intent,
        })
    }

    /// The change is done: delete intent `id` and release the change's
    /// tree locks `t`, in one request. The intent goes first (the `locks`
    /// index applies a bulk in order), so a crash in between leaves it
    /// under locks still held, for a roll-forward to take over; never the
    /// locks released with the intent left, which a roll-forward would
    /// replay over whatever other mounts changed meanwhile.
    pub(super) fn finish(&self, id: &str, t: TreeLock<'_>) -> FsResult<()> {
        let op = BulkOp::Delete {
            index: Idx::Locks,
            id: id.to_string(),
            if_version: None,
        };
        let res = t.release_with(vec![op])?;
        match res.into_iter().next() {
            Some(Ok(_)) | Some(Err(StoreError::NotFound(_))) => Ok(()),
            Some(Err(e)) => Err(e.into()),
            None => Err(FsError::Io("a one-item bulk answered nothing".into())),
        }
    }

    /// Where move intent `m` stands, for a roll-forward (under its locks).
    /// A file's live rename writes its plan with its locks, from names read
    /// before them, and confirms it after (see `Fs::rename`): a mount that
    /// died in between leaves a plan the names may contradict. Carried
    /// out only if the names still say what it planned; an intent whose
    /// bulk ran in part shows in the new name, or in the moved inode's
    /// back-link (the bulk's new entry refused, its link written).
    fn move_state(&self, m: &MoveIntent) -> FsResult<MoveState> {
        let e = &m.entry;
        let dst = self.docs.entry_fresh(e.parent, &decode_bytes(&e.name))?;
        let dst_ino = dst.as_ref().map(|(d, _)| d.ino);
        if dst_ino == Some(e.ino) {
            return Ok(MoveState::Landed);
        }
        if let Some((src, _)) = self
            .docs
            .entry_fresh(m.src_parent, &decode_bytes(&m.src_name))?
            && src.ino == e.ino
            && dst_ino == m.replaced
        {
            // A directory's plan made from a stale peek may move it into its
            // own subtree (the live rename refuses that after its fresh
            // read, but may have died first): never carried out.
            if src.kind == Kind::Dir && self.tree.is_ancestor(e.ino, e.parent)? {
                return Ok(MoveState::Stale);
            }
            return Ok(MoveState::Pending(Box::new(src)));
        }
        match self.docs.inode_fresh(e.ino) {
            Ok((i, _)) if i.links.iter().any(|l| l.p == e.parent && l.n == e.name) => {
                Ok(MoveState::Landed)
            }
            Ok(_) | Err(FsError::NotFound) => Ok(MoveState::Stale),
            Err(err) => Err(err),
        }
    }

    /// One janitor pass, one listing of the lock documents when nothing is
    /// stale: dead mounts' intents rolled forward, then their sessions and
    /// locks removed. Returns (intents, locks and sessions).
    pub(super) fn reap_dead_mounts(&self) -> FsResult<(usize, u64)> {
        let docs = LockManager::list(&*self.store)?;
        if self.lm.reap_dead(&docs, false)?.problems.is_empty() {
            return Ok((0, 0));
        }
        let rolled = self.recover()?;
        // The janitor's searches skip read-your-writes (it looks for old
        // documents), but this listing must not see the intents it just
        // finished: they would keep the dead owner's locks another pass.
        self.store.refresh(Idx::Locks)?;
        let docs = LockManager::list(&*self.store)?;
        Ok((rolled, self.lm.reap_dead(&docs, true)?.repaired))
    }

    /// Roll forward the intents of dead mounts (all of them on an exclusive
    /// store, whose only other writer was this mount's previous life).
    pub(super) fn recover(&self) -> FsResult<usize> {
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
            if owner == self.lm.owner() || (!self.single_writer && self.lm.alive(&owner)?) {
                continue;
            }
            // Take the intent over; if another mount was faster, leave it.
            let mut mine = serde_json::Value::clone(&doc.source);
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
            self.redo(&doc.id, &intent)?;
            done += 1;
        }
        Ok(done)
    }

    /// Roll intent `id` forward and delete it, under its locks.
    fn redo(&self, id: &str, intent: &Intent) -> FsResult<()> {
        // The change is ours now: take its locks like the dead owner did.
        let _g = self.tree.lock_all();
        self.store.refresh(Idx::Entries)?;
        let t = match intent {
            Intent::Move(m) => {
                let e = &m.entry;
                let (t, paths) = self.tree.lock(
                    &[m.src_parent, e.parent],
                    &[(m.src_parent, &m.src_name), (e.parent, &e.name)],
                )?;
                match self.move_state(m)? {
                    MoveState::Landed => {
                        self.moves.apply_move(m, None)?;
                    }
                    MoveState::Pending(src) => {
                        // From the old entry and the paths as they are now
                        // (the plan's copies may be older).
                        let dir = paths[1].clone();
                        let moved = MoveIntent {
                            old_path: src.path.clone(),
                            entry: Entry {
                                parent: e.parent,
                                name: e.name.clone(),
                                path: join_path(&dir, &e.name),
                                dir,
                                cookie: e.cookie,
                                ..*src
                            },
                            ..m.clone()
                        };
                        self.moves.apply_move(&moved, None)?;
                    }
                    MoveState::Stale => log::warn!(
                        "{id}: the names no longer match its plan (made from a stale read, \
                         never carried out): dropped"
                    ),
                }
                t
            }
            Intent::Exchange { a, b } => {
                let (t, _) = self.tree.lock(
                    &[a.parent, b.parent],
                    &[(a.parent, &a.name), (b.parent, &b.name)],
                )?;
                self.moves.apply_exchange(a, b, None)?;
                t
            }
        };
        self.finish(id, t)
    }
}
