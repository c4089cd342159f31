//! The documents: inodes and entries as types over the store, the
//! optimistic read-modify-write of an inode (read, change, write if the
//! version is still the one read, retry on conflict: what keeps several
//! mounts of one Elasticsearch index safe), the entries' copies of inode
//! attributes, an inode's deletion with its contents, and the batch that
//! one call's writes share.

use super::pending::Pending;
use crate::data::DataStore;
use crate::error::{FsError, FsResult};
use crate::model::{Entry, Inode, Kind, decode_bytes, decode_cow, entry_id, inode_id, text_id};
use crate::store::cache::{CachedStore, Gather};
use crate::store::{
    BulkItemResult, BulkOp, Capabilities, Doc, Idx, MetaStore, StoreError, StoreResult, Version,
};
use parking_lot::Mutex;
use serde_json::Value;
use std::sync::Arc;

/// Optimistic updates retry this often before reporting EAGAIN.
pub(super) const MAX_RETRIES: usize = 200;

/// A directory inode written, with the deferred time the write took along.
type DirWrite = (u64, Option<i64>);

/// An entry read, with its version; None: the name is free.
pub(super) type Found = Option<(Entry, Version)>;

/// What a read-modify-write of an inode does with its document.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Fate {
    Keep,
    /// Delete it with its contents; `open_size`: the size an open state
    /// of the inode holds, if it grew past the stored one.
    Delete {
        open_size: Option<u64>,
    },
}

/// A child of a directory as a listing in memory holds it.
pub(super) struct Listed<'a> {
    pub(super) name: std::borrow::Cow<'a, [u8]>,
    pub(super) ino: u64,
    pub(super) kind: Kind,
    pub(super) cookie: u64,
}

pub(super) fn to_doc<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("documents serialize")
}

/// A stored document as its type, with its version.
fn typed<T: serde::de::DeserializeOwned>(doc: Option<Doc>) -> FsResult<Option<(T, Version)>> {
    doc.map(|d| Ok((d.parse()?, d.version))).transpose()
}

/// Every item of a bulk must have succeeded. A version conflict there means
/// another writer changed the same document meanwhile: EAGAIN, not EIO.
pub(super) fn bulk_check(results: Vec<BulkItemResult>) -> FsResult<()> {
    for r in results {
        match r {
            Ok(_) => {}
            Err(StoreError::Conflict(_)) => return Err(FsError::Again),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// For calls on an inode number the kernel holds: its document being gone
/// means the kernel's name for it is stale, not that the path is missing
/// (see [`FsError::Stale`]). On shared stores an unlinked file only the
/// kernel remembers is deleted at once, so a rename over a file can race
/// an open(2) of its old inode.
pub(super) fn stale(e: FsError) -> FsError {
    match e {
        FsError::NotFound => FsError::Stale,
        e => e,
    }
}

pub(super) struct Docs {
    store: Arc<CachedStore>,
    data: Arc<dyn DataStore>,
    caps: Capabilities,
    /// Directory times waiting in memory go in with any write of their
    /// directory.
    pending: Arc<Pending>,
    /// A batch's documents (see `Fs::batch`): the directories written in
    /// it, with the deferred time each write took along, settled once the
    /// batch is acknowledged. None: every write is acknowledged on return.
    written: Option<Mutex<Vec<DirWrite>>>,
}

impl Docs {
    pub(super) fn new(
        store: Arc<CachedStore>,
        data: Arc<dyn DataStore>,
        pending: Arc<Pending>,
    ) -> Docs {
        Docs {
            caps: store.capabilities(),
            store,
            data,
            pending,
            written: None,
        }
    }

    /// The documents through a batch's handle (see `Fs::batch`).
    pub(super) fn batched(&self, store: Arc<CachedStore>) -> Docs {
        Docs {
            written: Some(Mutex::default()),
            ..Docs::new(store, self.data.clone(), self.pending.clone())
        }
    }

    /// The batch was acknowledged: what it wrote of directories settles.
    pub(super) fn batch_acknowledged(&self) {
        if let Some(w) = &self.written {
            self.pending.dirs_written(&std::mem::take(&mut *w.lock()));
        }
    }

    /// A directory's inode was written, taking along the deferred time `t`.
    fn wrote_dir(&self, ino: u64, t: Option<i64>) {
        match &self.written {
            Some(w) => w.lock().push((ino, t)),
            None => self.pending.dirs_written(&[(ino, t)]),
        }
    }

    /// Searches are near-real-time on Elasticsearch: under an exclusive
    /// lock, make the changes other mounts finished before it visible.
    /// (A mount's own writes are always visible to its searches.)
    pub(super) fn see_other_mounts(&self) -> FsResult<()> {
        if !self.caps.realtime_search {
            self.store.refresh(Idx::Entries)?;
        }
        Ok(())
    }

    // ---- reads ----

    pub(super) fn inode(&self, ino: u64) -> FsResult<(Inode, Version)> {
        typed(self.store.get(Idx::Inodes, &inode_id(ino))?)?.ok_or(FsError::NotFound)
    }

    /// [`Docs::inode`] from the store itself, not a cache in front of a
    /// shared one (see [`CachedStore::get_fresh`]).
    pub(super) fn inode_fresh(&self, ino: u64) -> FsResult<(Inode, Version)> {
        typed(self.store.get_fresh(Idx::Inodes, &inode_id(ino))?)?.ok_or(FsError::NotFound)
    }

    /// Inodes in one request, each with its version; NotFound if any is gone.
    pub(super) fn inodes(&self, inos: &[u64]) -> FsResult<Vec<(Inode, Version)>> {
        let ids: Vec<String> = inos.iter().map(|i| inode_id(*i)).collect();
        self.store
            .mget(Idx::Inodes, &ids)?
            .into_iter()
            .map(|d| {
                let d = d.ok_or(FsError::NotFound)?;
                Ok((d.parse()?, d.version))
            })
            .collect()
    }

    /// Whether the cache holds inode `ino` and trusts its copy (a read of
    /// it costs no round trip).
    pub(super) fn holds_inode(&self, ino: u64) -> bool {
        self.store.holds(Idx::Inodes, &inode_id(ino), false)
    }

    /// The entry `name` in `parent` as the cache last held it, when it
    /// holds a copy it no longer trusts (None: none, or one it trusts): a
    /// hint of what to read along with the entry.
    pub(super) fn stale_entry(&self, parent: u64, name: &[u8]) -> Option<Entry> {
        let id = entry_id(parent, name);
        if self.store.holds(Idx::Entries, &id, true) {
            return None;
        }
        let doc = self.store.hint(Idx::Entries, &id).flatten()?;
        doc.parse().ok()
    }

    // ---- directory listings kept in memory (see `crate::store::listing`) ----

    /// Passes the children of directory `dir` with a cookie above `after`
    /// to `f`, in cookie order, until it returns true. None: the cache
    /// keeps no listing of `dir` (the caller searches, and may gather).
    pub(super) fn listed_children(
        &self,
        dir: u64,
        after: u64,
        f: &mut dyn FnMut(Listed<'_>) -> bool,
    ) -> Option<()> {
        self.store.cached_children(dir, after, &mut |c| {
            f(Listed {
                name: decode_cow(c.name),
                ino: c.ino,
                kind: Kind::from_name(c.kind),
                cookie: c.cookie,
            })
        })
    }

    /// Begin gathering directory `dir` from its searches (from offset 0),
    /// for [`Docs::offer_listing`]; None: no listing would be kept.
    pub(super) fn gather(&self, dir: u64) -> Option<Gather> {
        self.store.gather(dir)
    }

    /// `dir` was read whole since [`Docs::gather`]: the cache may keep it.
    pub(super) fn offer_listing(&self, dir: u64, gathered: Gather) {
        self.store.offer_children(dir, gathered)
    }

    pub(super) fn entry(&self, parent: u64, name: &[u8]) -> FsResult<Found> {
        typed(self.store.get(Idx::Entries, &entry_id(parent, name))?)
    }

    /// [`Docs::entry`] where the source is not written back (a removal
    /// reads the inode number, kind and version): a brief copy serves, such
    /// as the one a lookup just read, which `entry` would read again whole.
    pub(super) fn entry_brief(&self, parent: u64, name: &[u8]) -> FsResult<Found> {
        typed(
            self.store
                .get_brief(Idx::Entries, &entry_id(parent, name))?,
        )
    }

    /// [`Docs::entry`] from the store itself: for a name read under an
    /// exclusive tree lock to decide a change of several documents.
    pub(super) fn entry_fresh(&self, parent: u64, name: &[u8]) -> FsResult<Found> {
        typed(
            self.store
                .get_fresh(Idx::Entries, &entry_id(parent, name))?,
        )
    }

    /// Two entries in one request (`a` and `b` may be the same): from the
    /// store (`fresh`), or a hint from whatever copies a cache holds.
    pub(super) fn two_entries(
        &self,
        a: (u64, &[u8]),
        b: (u64, &[u8]),
        fresh: bool,
    ) -> FsResult<(Found, Found)> {
        let ids = [entry_id(a.0, a.1), entry_id(b.0, b.1)];
        let docs = match fresh {
            true => self.store.mget_fresh(Idx::Entries, &ids)?,
            false => self.store.mget_hint(Idx::Entries, &ids)?,
        };
        let mut docs = docs.into_iter();
        let mut next = || -> FsResult<Found> {
            match docs.next().flatten() {
                Some(d) => Ok(Some((d.parse()?, d.version))),
                None => Ok(None),
            }
        };
        Ok((next()?, next()?))
    }

    // ---- writes ----

    /// Read-modify-write of an inode with optimistic concurrency.
    pub(super) fn update(
        &self,
        ino: u64,
        mut f: impl FnMut(&mut Inode) -> FsResult<()>,
    ) -> FsResult<Inode> {
        let (inode, _) = self.change(ino, |i| f(i).map(|()| Fate::Keep))?;
        Ok(inode)
    }

    /// Read-modify-write of an inode document under its version, retried
    /// when another call changed it in between: `f` changes the inode and
    /// says whether the document is written back or deleted.
    pub(super) fn change(
        &self,
        ino: u64,
        f: impl FnMut(&mut Inode) -> FsResult<Fate>,
    ) -> FsResult<(Inode, Fate)> {
        self.change_seen(ino, None, f)
    }

    /// [`Docs::change`] starting from a copy the caller read (and its
    /// version), saving a read: a conflict re-reads as usual.
    pub(super) fn change_seen(
        &self,
        ino: u64,
        mut seen: Option<(Inode, Version)>,
        mut f: impl FnMut(&mut Inode) -> FsResult<Fate>,
    ) -> FsResult<(Inode, Fate)> {
        let id = inode_id(ino);
        for _ in 0..MAX_RETRIES {
            let (mut inode, ver) = match seen.take() {
                Some(s) => s,
                None => self.inode(ino)?,
            };
            // A directory's times waiting in memory go in with this write
            // (before `f`, which may set them explicitly).
            let pending = self.pending.dir_time(&inode);
            if let Some(t) = pending {
                inode.mtime_ns = inode.mtime_ns.max(t);
                inode.ctime_ns = inode.ctime_ns.max(t);
            }
            let fate = f(&mut inode)?;
            let r = match fate {
                Fate::Keep => self
                    .store
                    .put(Idx::Inodes, &id, &to_doc(&inode), Some(ver))
                    .map(|_| ()),
                Fate::Delete { open_size } => self.delete_inode(&inode, Some(ver), open_size),
            };
            match r {
                Ok(()) => {
                    if inode.kind == Kind::Dir && self.pending.lazy() {
                        self.wrote_dir(ino, pending);
                    }
                    return Ok((inode, fate));
                }
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(FsError::Again)
    }

    /// [`Docs::update`] then [`Docs::sync_entries`], in one bulk where
    /// they were two writes or more: the inode conditional on the version
    /// read, each entry's attribute copy on its own. The inode's conflict
    /// retries (an entry written ahead of it is written again); an entry's
    /// (a rename or text refresh meanwhile) is synced the re-reading way.
    pub(super) fn update_synced(
        &self,
        ino: u64,
        f: impl FnMut(&mut Inode) -> FsResult<()>,
    ) -> FsResult<Inode> {
        self.update_synced_with(ino, Vec::new(), f).map(|(i, _)| i)
    }

    /// [`Docs::update_synced`] with `extra` writes in its bulk (sent again
    /// with each retry, so idempotent: a closing file's chunk deletes);
    /// the bool: every one of them landed (a delete finding nothing did).
    pub(super) fn update_synced_with(
        &self,
        ino: u64,
        extra: Vec<BulkOp>,
        mut f: impl FnMut(&mut Inode) -> FsResult<()>,
    ) -> FsResult<(Inode, bool)> {
        for _ in 0..MAX_RETRIES {
            let (mut inode, ver) = self.inode(ino)?;
            // As in `change_seen`: a directory's times waiting in memory go
            // in with this write.
            let pending = self.pending.dir_time(&inode);
            if let Some(t) = pending {
                inode.mtime_ns = inode.mtime_ns.max(t);
                inode.ctime_ns = inode.ctime_ns.max(t);
            }
            f(&mut inode)?;
            let mut ops = vec![BulkOp::Index {
                index: Idx::Inodes,
                id: inode_id(ino),
                source: to_doc(&inode),
                if_version: Some(ver),
            }];
            for link in &inode.links {
                let id = entry_id(link.p, &decode_bytes(&link.n));
                let Some(doc) = self.store.get(Idx::Entries, &id)? else {
                    continue;
                };
                let mut entry: Entry = doc.parse()?;
                if entry.ino == ino && entry.refresh_attrs(&inode) {
                    ops.push(BulkOp::Index {
                        index: Idx::Entries,
                        id,
                        source: to_doc(&entry),
                        if_version: Some(doc.version),
                    });
                }
            }
            let synced = ops.len();
            ops.extend(extra.iter().cloned());
            let mut results = self.store.bulk(ops)?;
            let extras = results.split_off(synced);
            let mut results = results.into_iter();
            match results.next().expect("one result per op") {
                Ok(_) => {}
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
            if inode.kind == Kind::Dir && self.pending.lazy() {
                self.wrote_dir(ino, pending);
            }
            if results.any(|r| r.is_err()) {
                self.sync_entries(&inode)?;
            }
            let landed = extras
                .iter()
                .all(|r| matches!(r, Ok(_) | Err(StoreError::NotFound(_))));
            return Ok((inode, landed));
        }
        Err(FsError::Again)
    }

    /// Copy the inode's searchable attributes into each of its entry documents.
    pub(super) fn sync_entries(&self, inode: &Inode) -> FsResult<()> {
        for link in &inode.links {
            let id = entry_id(link.p, &decode_bytes(&link.n));
            for _ in 0..MAX_RETRIES {
                let Some(doc) = self.store.get(Idx::Entries, &id)? else {
                    break;
                };
                let mut entry: Entry = doc.parse()?;
                if entry.ino != inode.ino || !entry.refresh_attrs(inode) {
                    break;
                }
                match self
                    .store
                    .put(Idx::Entries, &id, &to_doc(&entry), Some(doc.version))
                {
                    Ok(_) => break,
                    Err(StoreError::Conflict(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// An inode's document deleted (conditional on `ver`) with its
    /// contents and its text: in one bulk where they are documents of the
    /// store (the chunks by id, the text, then the inode), else the
    /// contents first. Either way
    /// a crash never leaves contents without an inode that owns them.
    /// `open_size`: what an open state knows of its size, if it grew past
    /// the stored figure.
    pub(super) fn delete_inode(
        &self,
        inode: &Inode,
        ver: Option<Version>,
        open_size: Option<u64>,
    ) -> StoreResult<()> {
        let mut ops = Vec::new();
        if let Some(key) = &inode.content {
            let size = open_size.unwrap_or(0).max(inode.size);
            match self.data.removal_ops(key, size) {
                Some(chunks) => ops = chunks,
                None => self
                    .data
                    .remove_sized(key, size)
                    .map_err(|e| StoreError::Other(e.to_string()))?,
            }
        }
        // Its text for search, if the indexer kept one (an absent one is
        // as good as deleted).
        if inode.kind == Kind::File {
            ops.push(BulkOp::Delete {
                index: Idx::Texts,
                id: text_id(inode.ino),
                if_version: None,
            });
        }
        ops.push(BulkOp::Delete {
            index: Idx::Inodes,
            id: inode_id(inode.ino),
            if_version: ver,
        });
        let mut results = self.store.bulk(ops)?;
        let own = results.pop().expect("one result per op");
        for r in results {
            match r {
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        match own {
            Ok(_) => {
                // Only now: until the document is gone its map names them.
                if let Some(key) = &inode.content {
                    self.data.removed(key, inode.map.as_ref());
                }
                Ok(())
            }
            Err(StoreError::NotFound(_)) if ver.is_none() => Ok(()),
            Err(e) => Err(e),
        }
    }
}
