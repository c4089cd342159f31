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
//! calls from it (a reply may take fewer entries than the page holds).

use super::*;
use crate::store::{Query, SearchRequest, Sort};
use serde::Deserialize;
use std::sync::atomic::Ordering;

#[derive(Clone, Debug)]
pub struct DirItem {
    /// Offset of the *next* item (what the kernel passes back to resume).
    pub offset: u64,
    pub ino: u64,
    pub kind: Kind,
    pub name: Vec<u8>,
    /// Attributes, for readdirplus.
    pub attr: Option<Inode>,
}

#[derive(Default)]
pub(super) struct DirHandle {
    /// The offset the page was fetched after, and the page.
    after: u64,
    page: Vec<DirItem>,
    plus: bool,
    /// Hash of each name returned since the last rewind -> its cookie. A
    /// name deleted and created again while the directory is being listed
    /// gets a new, higher cookie; it is not returned a second time (file
    /// managers listing a directory under lock-file churn must not show a
    /// name twice). 16 bytes per entry listed.
    returned: HashMap<u64, u64>,
}

/// Entries fetched per store query, and at most copied into one reply:
/// more than a reply buffer can take (the kernel sizes it from the
/// caller's getdents buffer, 32 KiB for glibc: ~1000 names, or ~200 names
/// with attributes), so each reply is full and a 10k listing takes a dozen
/// round trips, not a hundred.
const PAGE: usize = 1024;
const PAGE_PLUS: usize = 256;

impl Fs {
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        let (inode, _) = self.get_inode(ino)?;
        if inode.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dir_handles.lock().insert(fh, Default::default());
        Ok(fh)
    }

    pub fn releasedir(&self, fh: u64) {
        self.dir_handles.lock().remove(&fh);
    }

    /// Items after `offset`, at most one page; an empty result is the end.
    pub fn readdir(&self, ino: u64, fh: u64, offset: u64, plus: bool) -> FsResult<Vec<DirItem>> {
        let handle = self.dir_handles.lock().get(&fh).cloned();
        let Some(handle) = handle else {
            return self.fetch_dir(ino, offset, plus);
        };
        let mut h = handle.lock();
        // Serve from the cached page when the offset falls inside it.
        let start =
            if h.plus == plus && (offset == h.after || h.page.iter().any(|i| i.offset == offset)) {
                let pos = h.page.partition_point(|i| i.offset <= offset);
                (pos < h.page.len()).then_some(pos)
            } else {
                None
            };
        let pos = match start {
            Some(pos) => pos,
            None => {
                h.page = self.fetch_dir(ino, offset, plus)?;
                h.after = offset;
                h.plus = plus;
                0
            }
        };
        // Copy out no more than a reply can take, not the rest of the page.
        let items = h.page[pos..]
            .iter()
            .take(if plus { PAGE_PLUS } else { PAGE })
            .cloned()
            .collect::<Vec<_>>();
        if offset == 0 {
            h.returned.clear();
        }
        Ok(items
            .into_iter()
            .filter(|i| {
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                std::hash::Hash::hash(&i.name, &mut hasher);
                let cookie = *h
                    .returned
                    .entry(std::hash::Hasher::finish(&hasher))
                    .or_insert(i.offset);
                cookie == i.offset
            })
            .collect())
    }

    fn fetch_dir(&self, ino: u64, offset: u64, plus: bool) -> FsResult<Vec<DirItem>> {
        let (dir, _) = self.get_inode(ino)?;
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
            self.overlay(&mut d);
            items.push(dot(1, ino, b".", plus.then_some(d)));
        }
        if offset < 2 {
            let parent = dir.parent().unwrap_or(ROOT_INO);
            let attr = if plus {
                Some(self.getattr(parent)?)
            } else {
                None
            };
            items.push(dot(2, parent, b"..", attr));
        }
        // A listing needs four fields of each entry (the embedded store
        // reads them from columns, Elasticsearch filters `_source`).
        let rows = self.store.search_fields(
            &SearchRequest {
                index: Idx::Entries,
                query: Query::term("parent", ino),
                sort: vec![Sort::asc("cookie")],
                search_after: Some(vec![offset.max(2).into()]),
                size: if plus { PAGE_PLUS } else { PAGE },
            },
            &["name", "ino", "kind", "cookie"],
        )?;
        let mut entries = Vec::with_capacity(rows.len());
        for r in rows {
            let (Some(name), Some(ino), Some(cookie)) =
                (r[0].as_str(), r[1].as_u64(), r[3].as_u64())
            else {
                return Err(FsError::Io(format!(
                    "an entry of directory {ino} lacks listing fields: {r:?}"
                )));
            };
            let kind = Kind::deserialize(&r[2])?;
            entries.push((decode_bytes(name), ino, kind, cookie));
        }
        let attrs = if plus {
            let ids: Vec<String> = entries.iter().map(|e| inode_id(e.1)).collect();
            self.store.mget(Idx::Inodes, &ids)?
        } else {
            vec![]
        };
        for (i, (name, ino, kind, cookie)) in entries.into_iter().enumerate() {
            let attr = if plus {
                match attrs.get(i).cloned().flatten() {
                    Some(doc) => {
                        let mut inode: Inode = serde_json::from_value(doc.source)?;
                        self.overlay(&mut inode);
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
        Ok(items)
    }
}
