//! What Elasticsearch: The Definitive Guide, chapter "Handling Relationships"
//! ("Solving Concurrency Issues") leaves open: the half-done change of a
//! holder that died.
//!
//! The janitor finds intents (see [`super::intent`]) whose owners' leases
//! ran out and rolls them forward under the same tree locks; a mount's
//! start does the same for its previous life. Also the repairs `esfs fsck`
//! makes: link counts and paths recomputed from the truth.

use super::intent::{Intent, MoveIntent, MoveState};
use super::*;
use crate::store::{Query, Sort, scan};

impl Fs {
    /// Shared stores (Elasticsearch): a mount that died while other mounts
    /// kept running leaves intents and locks no restart may come back for.
    /// Every lease period, roll forward and release those whose owners'
    /// leases have run out.
    pub fn spawn_janitor(self: &Arc<Self>) {
        if self.caps.single_writer {
            return; // the only mount recovers at start
        }
        let fs = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("esfs-janitor".into())
            .spawn(move || {
                crate::store::Caller::Janitor.set_for_thread();
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
    /// locks removed (the Definitive Guide's tree locks would otherwise stay held by a
    /// mount killed hours ago). Returns (intents, locks and sessions).
    pub fn reap_dead_mounts(&self) -> FsResult<(usize, u64)> {
        let docs = LockManager::list(&*self.store)?;
        if self.lm.reap_dead(&docs, false)?.problems.is_empty() {
            return Ok((0, 0));
        }
        let rolled = self.recover_intents()?;
        // The janitor's searches skip read-your-writes (it looks for old
        // documents), but this listing must not see the intents it just
        // finished: they would keep the dead owner's locks another pass.
        self.store.refresh(Idx::Locks)?;
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
            if owner == self.lm.owner() || (!self.caps.single_writer && self.lm.alive(&owner)?) {
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
                        self.apply_move(m, None)?;
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
                        self.apply_move(&moved, None)?;
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
                self.apply_exchange(a, b, None)?;
                t
            }
        };
        self.finish_intent(id, t)
    }

    /// Set an inode's link count and back-links (fsck repair).
    pub fn set_links(&self, ino: u64, nlink: u32, links: Vec<Link>) -> FsResult<()> {
        self.docs.update(ino, |i| {
            i.nlink = nlink;
            if ino != ROOT_INO {
                i.links = links.clone();
            }
            Ok(())
        })?;
        Ok(())
    }
}
