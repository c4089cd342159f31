//! Directory listing.
//!
//! The readdir offset of an entry is its `cookie`, a filesystem-unique id
//! fixed when the name is created; listing is a search on `parent` sorted by
//! cookie with `search_after` = the offset. So offsets stay valid while the
//! directory changes (entries never shift), any offset can be resumed after
//! seekdir, and memory is bounded by one page whatever the directory's size.
//! "." and ".." take offsets 1 and 2; cookies start above them.
//!
//! Each open directory keeps the last fetched page and serves consecutive
//! calls from it (see [`crate::fs::dir_handles`]). Directories whose listing the document cache keeps in memory (`Docs::listed_children`:
//! the document cache's, filled when a directory is created or a search
//! reads one whole) skip the search, and plain READDIR copies their names
//! straight into the reply.

use crate::error::{FsError, FsResult};
use crate::fs::dir_handles::Cached;
use crate::fs::{DirEnt, DirItem, Fs};
use crate::model::{Inode, Kind, ROOT_INO, decode_string, inode_id};
use crate::store::cache::Gather;
use crate::store::{Idx, MetaStore, Query, SearchRequest, Sort};
use serde::Deserialize;
use serde_json::Value;

/// Entries fetched per store query: more than a reply buffer can take (the
/// kernel sizes it from the caller's getdents buffer, 32 KiB for glibc:
/// ~1000 names, or ~200 names with attributes), so each reply is full and
/// a 10k listing takes a dozen round trips, not a hundred. With attributes
/// too: `ls -l` of 1000 names is one search and one multi-get, which on
/// Elasticsearch is what it costs (the handle serves the page's rest).
const PAGE: usize = 1024;

impl Fs {
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        let (inode, _) = self.docs.inode(ino)?;
        if inode.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        Ok(self.dir_handles.open())
    }

    pub fn releasedir(&self, fh: u64) {
        self.dir_handles.release(fh);
    }

    /// Passes the items after `offset` to `add` until it returns true (the
    /// reply is full) or the page ends; nothing passed is the end. Items go
    /// out by reference: a listing copies no names but into the reply.
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(DirEnt<'_>) -> bool,
    ) -> FsResult<()> {
        self.hook.activity();
        let Some(handle) = self.dir_handles.get(fh) else {
            for it in &self.fetch_dir(ino, offset, plus, &mut None)?.0 {
                if add(it.ent()) {
                    break;
                }
            }
            return Ok(());
        };
        let mut h = handle.lock();
        h.seek(offset);
        // Names only, past the dots, of a directory listed in memory:
        // straight from the listing into the reply.
        if !plus && offset >= 2 {
            let returned = &mut h.returned;
            let served = self.docs.listed_children(ino, offset, &mut |c| {
                returned.first_time(&c.name, c.cookie)
                    && add(DirEnt {
                        offset: c.cookie,
                        ino: c.ino,
                        kind: c.kind,
                        name: &c.name,
                        attr: None,
                    })
            });
            if served.is_some() {
                return Ok(());
            }
        }
        // Serve from the cached page when the offset falls inside it.
        let pos = match h.cached(offset, plus) {
            Cached::At(pos) => pos,
            Cached::End => return Ok(()),
            Cached::Miss => {
                let (page, last) = self.fetch_dir(ino, offset, plus, &mut h.gather)?;
                h.keep(page, last, offset, plus);
                0
            }
        };
        h.serve(pos, add);
        Ok(())
    }

    /// A page of `ino`'s children from the store's search.
    fn search_dir(
        &self,
        ino: u64,
        offset: u64,
        size: usize,
        entries: &mut Vec<(Vec<u8>, u64, Kind, u64)>,
        gather: &mut Option<Gather>,
    ) -> FsResult<()> {
        // The token is taken before the first search: once the pages have
        // read the whole directory, the store may keep it as a listing
        // (unless a write under it landed meanwhile), and the next listing
        // needs no search.
        if offset <= 2 {
            *gather = self.docs.gather(ino);
        } else if gather.as_ref().is_some_and(|g| offset > g.upto()) {
            *gather = None; // a seekdir past what was gathered
        }
        // A listing needs four fields of each entry (the embedded store
        // reads them from columns, Elasticsearch filters `_source`).
        let rows = self.store.search_fields(
            &SearchRequest {
                past_own_writes: false,
                index: Idx::Entries,
                query: Query::term("parent", ino),
                sort: vec![Sort::asc("cookie")],
                search_after: Some(vec![offset.max(2).into()]),
                size,
            },
            &["name", "ino", "kind", "cookie"],
        )?;
        let whole = rows.len() < size;
        for mut r in rows {
            let (Value::String(name), Some(child), Some(cookie)) =
                (r[0].take(), r[1].as_u64(), r[3].as_u64())
            else {
                return Err(FsError::Io(format!(
                    "an entry of directory {ino} lacks listing fields: {r:?}"
                )));
            };
            let kind = Kind::deserialize(&r[2])?;
            if let Some(g) = gather.as_mut()
                && !g.add(&name, child, &r[2], cookie)
            {
                *gather = None;
            }
            entries.push((decode_string(name), child, kind, cookie));
        }
        if whole && let Some(g) = gather.take() {
            self.docs.offer_listing(ino, g);
        }
        Ok(())
    }

    /// The items after `offset`, and whether they are the directory's last.
    fn fetch_dir(
        &self,
        ino: u64,
        offset: u64,
        plus: bool,
        gather: &mut Option<Gather>,
    ) -> FsResult<(Vec<DirItem>, bool)> {
        let mark = self.files.settle_mark(ino);
        let (dir, _) = self.docs.inode(ino)?;
        if dir.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let mut items = Vec::new();
        let dot = |offset, ino, name: &[u8], attr: Option<Inode>| DirItem {
            offset,
            ino,
            kind: Kind::Dir,
            name: name.to_vec(),
            attr,
        };
        if offset < 1 {
            let mut d = dir.clone();
            if !self.files.overlay(&mut d, mark) {
                d = self.files.attr(ino)?;
            }
            items.push(dot(1, ino, b".", plus.then_some(d)));
        }
        if offset < 2 {
            let parent = dir.parent().unwrap_or(ROOT_INO);
            let attr = if plus {
                Some(self.files.attr(parent)?)
            } else {
                None
            };
            items.push(dot(2, parent, b"..", attr));
        }
        let size = PAGE;
        let mut entries = Vec::with_capacity(size.min(64));
        let cached = self.docs.listed_children(ino, offset.max(2), &mut |c| {
            entries.push((c.name.into_owned(), c.ino, c.kind, c.cookie));
            entries.len() >= size
        });
        if cached.is_none() {
            self.search_dir(ino, offset, size, &mut entries, gather)?;
        }
        let mut last = entries.len() < size;
        if plus {
            // Attributes of inodes the kernel already holds (it made or
            // looked them up) would be sent for nothing, and fetching them
            // is most of a plus page's cost: end the page before the first
            // such entry. With FUSE_READDIRPLUS_AUTO the kernel goes on with
            // plain READDIR and looks up only what it lacks. A page that
            // would be left empty keeps them all (empty means the end).
            if let Some(k) = self.files.first_held(entries.iter().map(|e| e.1))
                && (k > 0 || !items.is_empty())
            {
                entries.truncate(k);
                last = false;
            }
        }
        let (attrs, marks) = if plus {
            let marks: Vec<u64> = entries
                .iter()
                .map(|e| self.files.settle_mark(e.1))
                .collect();
            let ids: Vec<String> = entries.iter().map(|e| inode_id(e.1)).collect();
            (self.store.mget(Idx::Inodes, &ids)?, marks)
        } else {
            (vec![], vec![])
        };
        for (i, (name, ino, kind, cookie)) in entries.into_iter().enumerate() {
            let attr = if plus {
                match attrs.get(i).cloned().flatten() {
                    Some(doc) => {
                        let mut inode: Inode = doc.parse()?;
                        if !self.files.overlay(&mut inode, marks[i]) {
                            match self.files.attr(ino) {
                                Ok(fresh) => inode = fresh,
                                Err(FsError::NotFound) => continue,
                                Err(e) => return Err(e),
                            }
                        }
                        Some(inode)
                    }
                    None => continue, // removed since the search
                }
            } else {
                None
            };
            items.push(DirItem {
                offset: cookie,
                ino,
                kind,
                name,
                attr,
            });
        }
        Ok((items, last))
    }
}
