//! The rename plan: the intent document a rename writes before it starts,
//! and the idempotent steps that carry it out.
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

use crate::fs::*;
use crate::store::{Query, StoreResult};
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
    /// The seeds' directory rename: find every document strictly below `old`
    /// (one `path.tree` term) and bulk-update its `path` and `dir` to be below
    /// `new`, page by page, checking every item. A backend that can rewrite
    /// the subtree itself (the embedded store: one SQL statement) does so.
    pub(super) fn rewrite_subtree(&self, old: &str, new: &str) -> FsResult<()> {
        self.see_other_mounts()?;
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
        // Partial updates of `path` and `dir` only: the documents' other
        // fields (file text above all) are neither read nor rewritten.
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
        let mut retry: Vec<String> = Vec::new();
        crate::store::scan_brief(
            &*self.store,
            Idx::Entries,
            query,
            // Paths are unique, and this order is served by the path index
            // (a second key would force a sort of the whole subtree per page).
            vec![crate::store::Sort::asc("path")],
            1000,
            |hits| {
                let mut ops = Vec::with_capacity(hits.len());
                for h in hits {
                    ops.push(BulkOp::Update {
                        index: Idx::Entries,
                        doc: moved(&h.doc.source)?,
                        id: h.doc.id,
                        if_version: Some(h.doc.version),
                    });
                }
                let results = self.store.bulk(ops.clone())?;
                for (op, r) in ops.into_iter().zip(results) {
                    match r {
                        Ok(_) | Err(StoreError::NotFound(_)) => {}
                        // Changed concurrently (an attribute refresh): redo alone.
                        Err(StoreError::Conflict(_)) => retry.push(op.id().to_string()),
                        Err(e) => return Err(e),
                    }
                }
                Ok(true)
            },
        )?;
        for id in retry {
            for attempt in 0.. {
                let Some(doc) = self.store.get_brief(Idx::Entries, &id)? else {
                    break;
                };
                let path = doc.source["path"].as_str().unwrap_or_default();
                if !(path.starts_with(old) && path.as_bytes().get(old.len()) == Some(&b'/')) {
                    break;
                }
                let r = self.store.bulk(vec![BulkOp::Update {
                    index: Idx::Entries,
                    id: id.clone(),
                    doc: moved(&doc.source)?,
                    if_version: Some(doc.version),
                }])?;
                match r.into_iter().next().expect("one result") {
                    Ok(_) | Err(StoreError::NotFound(_)) => break,
                    Err(StoreError::Conflict(_)) if attempt < MAX_RETRIES => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }
}

/// Replace the back-link (from_p, from_n) of an inode with (to_p, to_n).
/// Idempotent: running it again (crash recovery) changes nothing.
pub(super) fn relink(i: &mut Inode, from_p: u64, from_n: &str, to_p: u64, to_n: &str) {
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
