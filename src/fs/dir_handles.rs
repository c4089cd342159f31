//! Open directories: each handle keeps the last page fetched (and serves
//! consecutive readdir calls from it: a reply may take fewer entries than
//! the page holds), the names returned since the last rewind (a name is
//! never returned twice in one listing), and the directory as gathered so
//! far from offset 0, which the store may keep as its listing once the
//! pages have read it whole.

use crate::model::{Inode, Kind};
use crate::store::cache::Gather;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// What a readdir reply takes: an item, borrowed.
#[derive(Clone, Copy, Debug)]
pub struct DirEnt<'a> {
    pub offset: u64,
    pub ino: u64,
    pub kind: Kind,
    pub name: &'a [u8],
    pub attr: Option<&'a Inode>,
}

impl DirItem {
    pub(super) fn ent(&self) -> DirEnt<'_> {
        DirEnt {
            offset: self.offset,
            ino: self.ino,
            kind: self.kind,
            name: &self.name,
            attr: self.attr.as_ref(),
        }
    }
}

/// The table of open directories.
pub(super) struct DirHandles {
    handles: Mutex<HashMap<u64, Arc<Mutex<DirHandle>>>>,
    next_fh: AtomicU64,
}

impl Default for DirHandles {
    fn default() -> Self {
        DirHandles {
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
    }
}

impl DirHandles {
    /// A new handle.
    pub(super) fn open(&self) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Default::default());
        fh
    }

    pub(super) fn release(&self, fh: u64) {
        self.handles.lock().remove(&fh);
    }

    pub(super) fn get(&self, fh: u64) -> Option<Arc<Mutex<DirHandle>>> {
        self.handles.lock().get(&fh).cloned()
    }
}

/// Names returned since the last rewind: hash of the name -> its cookie.
/// The hash is keyed per handle (std's random SipHash keys): with fixed
/// keys, names crafted to collide could hide one another from a listing.
#[derive(Default)]
pub(super) struct Returned {
    keys: std::collections::hash_map::RandomState,
    seen: HashMap<u64, u64, BuildHasherDefault<Prehashed>>,
}

impl Returned {
    /// Whether `name` (at `cookie`) was not yet returned since the rewind.
    pub(super) fn first_time(&mut self, name: &[u8], cookie: u64) -> bool {
        let hash = self.keys.hash_one(name);
        *self.seen.entry(hash).or_insert(cookie) == cookie
    }

    fn clear(&mut self) {
        self.seen.clear();
    }
}

/// The `Returned` keys are already SipHash values: hashing them again
/// was a tenth of a listing's cost.
#[derive(Default)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Where a call's offset stands with the handle's page.
pub(super) enum Cached {
    /// Served from the page, from this position.
    At(usize),
    /// Past the directory's last entry: the end.
    End,
    /// Not in the page: fetch.
    Miss,
}

#[derive(Default)]
pub(super) struct DirHandle {
    /// The offset the page was fetched after, and the page.
    after: u64,
    page: Vec<DirItem>,
    plus: bool,
    /// The page holds the directory's last entries: a call past them is
    /// the end, without another search.
    last: bool,
    /// Hash of each name returned since the last rewind -> its cookie. A
    /// name deleted and created again while the directory is being listed
    /// gets a new, higher cookie; it is not returned a second time (file
    /// managers listing a directory under lock-file churn must not show a
    /// name twice). 16 bytes per entry listed.
    pub(super) returned: Returned,
    /// The directory as read so far from offset 0, for the store's listing.
    pub(super) gather: Option<Gather>,
}

impl DirHandle {
    /// A call at `offset`: offset 0 rewinds.
    pub(super) fn seek(&mut self, offset: u64) {
        if offset == 0 {
            self.returned.clear();
        }
    }

    /// Whether the page serves a call at `offset` (`plus`: with attributes).
    pub(super) fn cached(&self, offset: u64, plus: bool) -> Cached {
        if self.plus == plus
            && (offset == self.after || self.page.iter().any(|i| i.offset == offset))
        {
            let pos = self.page.partition_point(|i| i.offset <= offset);
            if pos < self.page.len() {
                return Cached::At(pos);
            }
        }
        let past_last = self.last
            && self.plus == plus
            && self
                .page
                .last()
                .map_or(offset == self.after, |i| i.offset == offset);
        match past_last {
            true => Cached::End,
            false => Cached::Miss,
        }
    }

    /// Keep `page`, fetched after `offset` (`last`: it ends the directory).
    pub(super) fn keep(&mut self, page: Vec<DirItem>, last: bool, offset: u64, plus: bool) {
        (self.page, self.last) = (page, last);
        self.after = offset;
        self.plus = plus;
    }

    /// Pass the page's items from `pos` not yet returned to `add`, until
    /// it returns true (the reply is full).
    pub(super) fn serve(&mut self, pos: usize, mut add: impl FnMut(DirEnt<'_>) -> bool) {
        let DirHandle { page, returned, .. } = self;
        for it in &page[pos..] {
            if returned.first_time(&it.name, it.offset) && add(it.ent()) {
                break;
            }
        }
    }
}
