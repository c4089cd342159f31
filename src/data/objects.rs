//! File contents in S3-compatible object storage (`--data s3://BUCKET/PREFIX`):
//! the bytes as immutable blocks ([`BlockStore`]), and per file a *block
//! map* naming them, kept in the file's inode document (`Inode::map`) and
//! committed there by the filesystem with the size and times, in one write
//! under the document's version check. Small files stay inline in the
//! metadata store, as chunk documents ([`ChunkStore`]), so a lookup reads
//! them with their inode in one round trip.
//!
//! Documents of this store (all in the `chunks` index, whose searchable
//! fields are `file` and `n`, so no schema change):
//! - `<key>:<n>` (n >= 0): inline contents (see `chunks`), for files that
//!   never grew past [`INLINE_MAX`];
//! - `gc:<key>:<block>` (`file` = [`GC_FILE`], `n` = ms when superseded):
//!   `{"of": key, "blocks": [...]}`, blocks no map names any more, deleted
//!   from the object store after the grace period by any mount's collector
//!   or by `esfs fsck --repair`;
//! - `<key>:map` (`n` = -1): where older esfs kept a file's map
//!   (`{"map": [[off, len, "block", at], ...]}`). Read when the inode
//!   holds no map; the next commit of the file moves it into the inode and
//!   deletes the document.
//!
//! Commit protocol: a write-out uploads the buffered bytes as fresh blocks
//! (in parallel) and *stages* their extents: reads here see them, nothing
//! is committed. At close/fsync (and setattr's truncate) the filesystem
//! takes the staged change ([`DataStore::stage`]), applies it to the map it
//! reads in the inode document, and writes the document back with the new
//! size under its version; on a conflict (another mount committed
//! meanwhile) it re-reads and re-applies (last writer wins per byte range);
//! the uploaded blocks stay valid. Then ([`DataStore::committed`]) a gc
//! document names the blocks the new map superseded. So a reader (who
//! takes the map and the size from one document version, at open) sees one
//! committed version, and a crash leaves at worst blocks no document
//! names: orphans, whose age is in their name, for fsck.

use super::blocks::{BlockError, BlockId, BlockMap, BlockMeta, BlockStore, Extent, ReadAhead};
use super::chunks::ChunkStore;
use super::{Capacity, DataStore, MapChange, MapOp, Piece, StoreAudit};
use crate::store::{Doc, Idx, MetaStore, Query, SearchRequest, Sort, StoreError, Version};
use bytes::Bytes;
use parking_lot::{Condvar, Mutex, MutexGuard};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Files up to this size stay inline in the metadata store. 64 KiB: below
/// it, one block's PUT and GET (two object-store round trips, each a few ms
/// even on a LAN, plus an extent in the map) cost more than carrying the bytes in
/// a document read with the inode; above it, base64 in a search engine's
/// documents (a third bigger, replicated, merged) stops being cheap.
pub(crate) const INLINE_MAX: u64 = 64 << 10;
/// A file's buffered bytes that do not fill whole blocks (random writes)
/// are uploaded once past this (whole blocks go as soon as they are full,
/// see `ObjectStore::write`).
const FLUSH_AT: usize = 64 << 20;
/// A file not in blocks yet is written out (moved out of line) in the
/// background once this much is buffered; then its whole blocks go as
/// they fill. (Smaller files are uploaded at close, in one round.)
const FIRST_FLUSH_AT: usize = 16 << 20;
/// Sequential readers prefetch this far ahead: 16 blocks, as many as the
/// store's default downloads in flight (1 GiB read cold through a 1 ms
/// round trip: 278-289 MB/s with 32 MiB, 309-370 with 64 MiB, 270-386
/// with 128 MiB).
const READ_AHEAD: u64 = 64 << 20;
/// The `file` of gc documents: never a content key (those are decimal).
pub(crate) const GC_FILE: &str = "~gc";
/// The `n` of (legacy) map documents (inline chunks are 0, 1, ...).
const MAP_N: i64 = -1;
const STRIPES: usize = 32;

fn map_id(key: &str) -> String {
    format!("{key}:map")
}

fn stripe(key: &str) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % STRIPES as u64) as usize
}

fn store_err(e: StoreError) -> io::Error {
    io::Error::other(e)
}

/// Written ranges not yet uploaded: offset -> bytes, not overlapping.
#[derive(Default, Clone)]
struct Dirty {
    ranges: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
}

impl Dirty {
    fn end(&self) -> u64 {
        self.ranges
            .iter()
            .next_back()
            .map_or(0, |(o, d)| o + d.len() as u64)
    }

    fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// `data` at `off`, over what was there.
    fn put(&mut self, off: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = off + data.len() as u64;
        // A stream appending to its last range: extend it.
        let clear = self.ranges.range(off..end).next().is_none();
        if let Some((&s, v)) = self.ranges.range_mut(..off).next_back()
            && s + v.len() as u64 == off
            && clear
        {
            v.extend_from_slice(data);
            self.bytes += data.len();
            return;
        }
        let mut lo = off;
        let mut hi = end;
        let mut touched: Vec<u64> = Vec::new();
        if let Some((&s, v)) = self.ranges.range(..off).next_back()
            && s + v.len() as u64 >= off
        {
            touched.push(s);
        }
        touched.extend(self.ranges.range(off..=end).map(|(s, _)| *s));
        for s in &touched {
            let v = &self.ranges[s];
            lo = lo.min(*s);
            hi = hi.max(s + v.len() as u64);
        }
        let mut merged = vec![0u8; (hi - lo) as usize];
        for s in touched {
            let v = self.ranges.remove(&s).expect("listed");
            self.bytes -= v.len();
            merged[(s - lo) as usize..(s - lo) as usize + v.len()].copy_from_slice(&v);
        }
        merged[(off - lo) as usize..(end - lo) as usize].copy_from_slice(data);
        self.bytes += merged.len();
        self.ranges.insert(lo, merged);
    }

    /// Copy what these ranges hold of `off..off+buf.len()` into `buf`: the
    /// end (relative to `off`) of the last byte copied, 0 if none.
    fn overlay(&self, off: u64, buf: &mut [u8]) -> usize {
        let end = off + buf.len() as u64;
        let mut held = 0;
        let first = self
            .ranges
            .range(..off)
            .next_back()
            .map(|(s, _)| *s)
            .unwrap_or(off);
        for (s, v) in self.ranges.range(first..end) {
            held = held.max(overlay(*s, v, off, buf));
        }
        held
    }

    /// Take out the whole blocks (of `bs` bytes, at multiples of it) these
    /// ranges cover: each block's offset and bytes.
    fn take_blocks(&mut self, bs: u64) -> Vec<(u64, Vec<u8>)> {
        let full: Vec<u64> = self
            .ranges
            .iter()
            .filter(|(s, v)| (*s).div_ceil(bs) < (*s + v.len() as u64) / bs)
            .map(|(s, _)| *s)
            .collect();
        let mut out = Vec::new();
        for s in full {
            let mut v = self.ranges.remove(&s).expect("listed");
            self.bytes -= v.len();
            let (first, last) = (s.div_ceil(bs) * bs, (s + v.len() as u64) / bs * bs);
            let tail = v.split_off((last - s) as usize);
            let mid = v.split_off((first - s) as usize);
            if !v.is_empty() {
                self.bytes += v.len();
                self.ranges.insert(s, v);
            }
            if !tail.is_empty() {
                self.bytes += tail.len();
                self.ranges.insert(last, tail);
            }
            if mid.len() as u64 == bs {
                out.push((first, mid)); // a stream's block: no copy
            } else {
                let blocks = mid.chunks(bs as usize).map(<[u8]>::to_vec);
                out.extend((first..).step_by(bs as usize).zip(blocks));
            }
        }
        out
    }

    /// `older` under these ranges (these win where both hold bytes).
    fn under(&mut self, older: Dirty) {
        let newer = std::mem::replace(self, older);
        for (off, data) in newer.ranges {
            self.put(off, &data);
        }
    }

    fn truncate(&mut self, size: u64) {
        let cut: Vec<u64> = self.ranges.range(..).map(|(s, _)| *s).collect();
        for s in cut {
            let v = self.ranges.get_mut(&s).expect("listed");
            if s >= size {
                self.bytes -= v.len();
                self.ranges.remove(&s);
            } else if s + v.len() as u64 > size {
                self.bytes -= v.len() - (size - s) as usize;
                v.truncate((size - s) as usize);
            }
        }
    }
}

/// Copy what `v`, the bytes at `s`, holds of `off..off+buf.len()` into
/// `buf`: the end (relative to `off`) of the last byte copied, 0 if none.
fn overlay(s: u64, v: &[u8], off: u64, buf: &mut [u8]) -> usize {
    let end = off + buf.len() as u64;
    let (a, b) = (s.max(off), (s + v.len() as u64).min(end));
    if a >= b {
        return 0;
    }
    buf[(a - off) as usize..(b - off) as usize]
        .copy_from_slice(&v[(a - s) as usize..(b - s) as usize]);
    (b - off) as usize
}

/// A whole block on its way to the object store while the writer goes on
/// (see `ObjectStore::write`).
struct Upload {
    /// Its number among staged ops: uploads stage in the order they were
    /// cut, whatever order they land in.
    n: u64,
    off: u64,
    data: Bytes,
    /// None while in flight.
    result: Option<io::Result<Vec<Extent>>>,
}

/// Where a file's contents are, as this mount last read or committed it.
#[derive(Clone)]
enum Where {
    /// Not known (read the inode document, then a legacy map document).
    Unknown,
    /// Inline chunk documents; no blocks.
    Inline,
    /// A committed map.
    Map(Arc<BlockMap>),
}

struct FileState {
    at: Where,
    /// `at` is a legacy `<key>:map` document's map (the inode holds none):
    /// the next commit moves it into the inode and deletes the document.
    legacy: bool,
    /// The inode's map was handed to `opening` (none means none: only a
    /// legacy document or inline chunks remain to look at).
    inode_seen: bool,
    /// Uploaded and not committed yet, in order, numbered: what the next
    /// `stage` hands out, and what reads here see over `at`.
    staged: Vec<(u64, MapOp)>,
    /// The staged ops move the file out of line (its inline bytes are in
    /// their blocks): more writes go to blocks, and the inline chunks go
    /// once committed.
    from_inline: bool,
    /// `at` with the staged ops applied (None: nothing staged).
    view: Option<Arc<BlockMap>>,
    dirty: Dirty,
    /// Ranges being uploaded: still served to reads.
    flushing: Dirty,
    /// Whole blocks being uploaded in the background, in the order they
    /// were cut (served to reads); each is staged when it and all before
    /// it have landed. A failed one stays, with the ones after it, until a
    /// write-out takes their bytes back (see `ObjectStore::quiesce`).
    queue: VecDeque<Upload>,
    /// Nothing is stored at or past this (the size at open, raised by
    /// writes, set by truncates); None: not opened here.
    end: Option<u64>,
    /// Opened with at most INLINE_MAX bytes: the inline chunk is read
    /// first and trusted if it holds exactly that many (see `locate`).
    small_at_open: Option<u64>,
    /// The sequential-read detector, shared by the reads in flight (the
    /// kernel sends several at once): held across a read, so they see
    /// one stream and fetch whole blocks, not ranges.
    ra: Arc<Mutex<ReadAhead>>,
    /// A background upload of this file is under way (see `write`).
    uploading: bool,
}

impl Default for FileState {
    fn default() -> Self {
        FileState {
            at: Where::Unknown,
            legacy: false,
            inode_seen: false,
            staged: Vec::new(),
            from_inline: false,
            view: None,
            dirty: Dirty::default(),
            flushing: Dirty::default(),
            queue: VecDeque::new(),
            end: None,
            small_at_open: None,
            ra: Arc::new(Mutex::new(ReadAhead::new(READ_AHEAD))),
            uploading: false,
        }
    }
}

impl FileState {
    /// Nothing written here that is not committed.
    fn idle(&self) -> bool {
        self.dirty.is_empty()
            && self.flushing.is_empty()
            && self.staged.is_empty()
            && self.queue.is_empty()
    }

    /// Stage `op` (numbered `n`, after what is staged already).
    fn stage_op(&mut self, n: u64, op: MapOp) {
        let view = match (&self.view, &self.at) {
            (Some(v), _) => op.apply(v),
            (None, Where::Map(m)) => op.apply(m),
            (None, _) => op.apply(&BlockMap::default()),
        };
        self.staged.push((n, op));
        self.view = Some(Arc::new(view));
    }

    /// Stage the uploads at the head of the queue that have landed.
    fn drain(&mut self) {
        while let Some(Upload {
            result: Some(Ok(_)),
            ..
        }) = self.queue.front()
        {
            let u = self.queue.pop_front().expect("a front");
            if let Some(Ok(extents)) = u.result {
                self.stage_op(u.n, MapOp::Write(extents));
            }
        }
    }

    /// Whether the contents are (or, once staged ops land, will be) blocks.
    fn in_blocks(&self) -> bool {
        self.from_inline || matches!(self.at, Where::Map(..))
    }

    /// The map reads use: the committed one with what is staged over it.
    fn read_map(&self) -> Option<Arc<BlockMap>> {
        match (&self.view, &self.at) {
            (Some(v), _) => Some(v.clone()),
            (None, Where::Map(m)) => Some(m.clone()),
            _ => None,
        }
    }

    fn restage(&mut self) {
        self.view = (!self.staged.is_empty()).then(|| {
            let base = match &self.at {
                Where::Map(m) => (**m).clone(),
                _ => BlockMap::default(),
            };
            Arc::new(self.staged.iter().fold(base, |m, (_, op)| op.apply(&m)))
        });
    }

    /// The map change of everything staged, for the filesystem to commit.
    fn change(&self) -> Option<MapChange> {
        let (upto, _) = self.staged.last()?;
        Some(MapChange {
            ops: self.staged.iter().map(|(_, op)| op.clone()).collect(),
            legacy: match &self.at {
                Where::Map(m) if self.legacy => Some(m.clone()),
                _ => None,
            },
            from_inline: self.from_inline,
            upto: *upto,
        })
    }
}

pub(crate) struct ObjectStore {
    /// Itself, for the background write-outs it starts.
    me: std::sync::Weak<ObjectStore>,
    /// The store itself, no cache in front: a map read is the committed one.
    meta: Arc<dyn MetaStore>,
    blocks: Arc<BlockStore>,
    inline: ChunkStore,
    files: Arc<Mutex<HashMap<String, FileState>>>,
    /// Notified when an upload of a queue lands.
    landed: Arc<Condvar>,
    /// Queued uploads in flight, all files; a writer waits while there are
    /// `max_queued` (the upload pipeline's back-pressure).
    queued: Arc<AtomicUsize>,
    max_queued: usize,
    /// Numbers staged ops (see `FileState::staged`).
    seq: std::sync::atomic::AtomicU64,
    /// One write-out, truncate or removal per file at a time, so the ops
    /// of one mount are staged in order.
    writing: [Mutex<()>; STRIPES],
    /// The object store failed its last operation (logged once per outage).
    down: AtomicBool,
    /// How long superseded blocks are kept for readers of older versions.
    grace: Duration,
}

impl ObjectStore {
    pub(crate) fn new(
        meta: Arc<dyn MetaStore>,
        blocks: Arc<BlockStore>,
        grace: Duration,
    ) -> Arc<ObjectStore> {
        Arc::new_cyclic(|me| ObjectStore {
            me: me.clone(),
            inline: ChunkStore::new(meta.clone()),
            meta,
            max_queued: 2 * blocks.concurrency(),
            blocks,
            files: Default::default(),
            landed: Default::default(),
            queued: Default::default(),
            seq: Default::default(),
            writing: std::array::from_fn(|_| Mutex::new(())),
            down: AtomicBool::new(false),
            grace,
        })
    }

    /// Note the store's state: each failed operation is logged by the FUSE
    /// layer (one line naming the URL and the cause); the recovery once,
    /// here.
    fn note<T>(&self, r: Result<T, BlockError>) -> io::Result<T> {
        match r {
            Ok(v) => {
                if self.down.swap(false, Ordering::Relaxed) {
                    log::warn!("object store {} answers again", self.blocks.describe());
                }
                Ok(v)
            }
            Err(e) => {
                if matches!(e, BlockError::Unavailable(_)) {
                    self.down.store(true, Ordering::Relaxed);
                }
                Err(e.into())
            }
        }
    }

    /// The legacy map document of `key` as stored now, None if there is
    /// none.
    fn read_legacy_map(&self, key: &str) -> io::Result<Option<BlockMap>> {
        let Some(doc) = self
            .meta
            .get(Idx::Chunks, &map_id(key))
            .map_err(store_err)?
        else {
            return Ok(None);
        };
        Ok(Some(parse_map(key, &doc.source["map"])?))
    }

    /// The map in `key`'s inode document (the content key is the inode
    /// number), for a file not opened here: Some(None) when the inode holds
    /// none, None when there is no such inode.
    fn read_inode_map(&self, key: &str) -> io::Result<Option<Option<BlockMap>>> {
        let Ok(ino) = key.parse::<u64>() else {
            return Ok(None);
        };
        let id = crate::model::inode_id(ino);
        let Some(doc) = self.meta.get(Idx::Inodes, &id).map_err(store_err)? else {
            return Ok(None);
        };
        let field = &doc.source["map"];
        if field.is_null() {
            return Ok(Some(None));
        }
        Ok(Some(Some(parse_map(key, field)?)))
    }

    /// Where `key`'s contents are, reading what it takes to know: the inode
    /// document (unless `opening` passed its map), then, for a file whose
    /// inode holds none, its inline chunk or a legacy map document.
    fn locate(&self, key: &str) -> io::Result<Where> {
        let (at, small, seen) = {
            let files = self.files.lock();
            match files.get(key) {
                Some(f) => (f.at.clone(), f.small_at_open, f.inode_seen),
                None => (Where::Unknown, None, false),
            }
        };
        if !matches!(at, Where::Unknown) {
            return Ok(at);
        }
        if !seen && let Some(Some(m)) = self.read_inode_map(key)? {
            return Ok(self.settle(key, in_inode(m), false));
        }
        // A small file's inline chunk (often read with its inode already)
        // holding exactly its size is its contents: no map to look for.
        if let Some(size) = small.filter(|s| *s > 0) {
            let mut b = vec![0u8; size as usize];
            if self.inline.read(key, 0, &mut b)? == size as usize {
                return Ok(self.settle(key, Where::Inline, false));
            }
        }
        // The inode read at open may predate another mount moving the file
        // out of line (its inline chunks are gone then): its map now, read
        // at the length this open knows, beats zeros.
        if seen && let Some(Some(m)) = self.read_inode_map(key)? {
            return Ok(self.settle(key, in_inode(m), false));
        }
        Ok(match self.read_legacy_map(key)? {
            Some(m) => self.settle(key, Where::Map(Arc::new(m)), true),
            None => self.settle(key, Where::Inline, false),
        })
    }

    /// Record where `key` is, unless a commit here said otherwise meanwhile.
    fn settle(&self, key: &str, found: Where, legacy: bool) -> Where {
        let mut files = self.files.lock();
        let f = files.entry(key.to_string()).or_default();
        if matches!(f.at, Where::Unknown) {
            f.at = found;
            f.legacy = legacy;
            f.restage();
        }
        f.at.clone()
    }

    fn write_out(&self, key: &str) -> io::Result<()> {
        let _w = self.writing[stripe(key)].lock();
        self.write_out_locked(key)
    }

    /// Wait until `key`'s queued uploads have landed (its write lock
    /// held): all staged, or, after a failure, the bytes of the failed one
    /// and those after it back under the buffer (to be uploaded again; the
    /// blocks that landed after the failure are recorded as garbage). The
    /// lock is still held when this returns, so no upload is queued before
    /// the caller has taken what it wants.
    fn quiesce(&self, key: &str) -> MutexGuard<'_, HashMap<String, FileState>> {
        let mut files = self.files.lock();
        while files
            .get(key)
            .is_some_and(|f| f.queue.iter().any(|u| u.result.is_none()))
        {
            self.landed.wait(&mut files);
        }
        let Some(f) = files.get_mut(key) else {
            return files;
        };
        let mut back = Dirty::default();
        let mut garbage = Vec::new();
        for u in std::mem::take(&mut f.queue) {
            back.put(u.off, &u.data);
            if let Some(Ok(extents)) = u.result {
                garbage.extend(extents.iter().map(|e| e.block));
            }
        }
        if !back.is_empty() {
            f.dirty.under(back);
        }
        if !garbage.is_empty() {
            drop(files);
            let _ = self.record_garbage(key, &garbage);
            files = self.files.lock();
        }
        files
    }

    /// Upload what is buffered of `key` and stage it (its write lock held).
    fn write_out_locked(&self, key: &str) -> io::Result<()> {
        let (ranges, end) = {
            let mut files = self.quiesce(key);
            let Some(f) = files.get_mut(key) else {
                return Ok(());
            };
            if f.dirty.is_empty() {
                return Ok(());
            }
            f.flushing = std::mem::take(&mut f.dirty);
            let end = f.end.unwrap_or(0).max(f.flushing.end());
            (f.flushing.clone(), end)
        };
        let r = self.write_ranges(key, &ranges, end);
        let mut files = self.files.lock();
        let f = files.entry(key.to_string()).or_default();
        let flushed = std::mem::take(&mut f.flushing);
        if r.is_err() {
            // Kept for a later flush; what was written since is newer.
            f.dirty.under(flushed);
        }
        r
    }

    /// Inline files up to INLINE_MAX are written (and committed) in their
    /// chunk documents; anything else is uploaded and staged.
    fn write_ranges(&self, key: &str, ranges: &Dirty, end: u64) -> io::Result<()> {
        let at = self.locate(key)?;
        let blocks = self.files.lock().get(key).is_some_and(|f| f.in_blocks());
        match at {
            _ if blocks => {
                let extents = self.upload(key, ranges)?;
                self.push(key, MapOp::Write(extents), false);
                Ok(())
            }
            Where::Inline if end <= INLINE_MAX => {
                for (off, data) in &ranges.ranges {
                    self.inline.write(key, *off, data)?;
                }
                self.inline.flush(key)
            }
            _ => self.move_out_of_line(key, ranges),
        }
    }

    /// Stage `op` (after what is staged already).
    fn push(&self, key: &str, op: MapOp, from_inline: bool) {
        let n = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut files = self.files.lock();
        let f = files.entry(key.to_string()).or_default();
        f.stage_op(n, op);
        f.from_inline |= from_inline;
    }

    /// Start uploading `blocks` of `key` (cut from its buffer, in order)
    /// in the background; each lands in its queue entry.
    fn enqueue(&self, key: &str, f: &mut FileState, blocks: Vec<(u64, Vec<u8>)>) {
        for (off, data) in blocks {
            let n = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
            let data = Bytes::from(data);
            f.queue.push_back(Upload {
                n,
                off,
                data: data.clone(),
                result: None,
            });
            self.queued.fetch_add(1, Ordering::Relaxed);
            let (files, landed, queued, k) = (
                self.files.clone(),
                self.landed.clone(),
                self.queued.clone(),
                key.to_string(),
            );
            self.blocks.spawn_put(key, off, data, move |r| {
                let mut files = files.lock();
                match files.get_mut(&k) {
                    Some(f) => {
                        if let Some(u) = f.queue.iter_mut().find(|u| u.n == n) {
                            u.result = Some(r.map_err(io::Error::from));
                        }
                        f.drain();
                    }
                    // Removed meanwhile (`remove_sized` waits for the
                    // queue, so not by this mount): fsck finds the orphans.
                    None => log::info!("upload of {k} landed after its removal"),
                }
                queued.fetch_sub(1, Ordering::Relaxed);
                landed.notify_all();
            });
        }
    }

    fn upload(&self, key: &str, ranges: &Dirty) -> io::Result<Vec<Extent>> {
        let parts = ranges
            .ranges
            .iter()
            .map(|(o, d)| (*o, Bytes::copy_from_slice(d)))
            .collect();
        self.note(self.blocks.put_ranges(key, parts))
    }

    /// An inline file grows past INLINE_MAX: its inline bytes and the new
    /// ones become blocks, staged as its first map; the inline chunks go
    /// once that is committed (see `committed`).
    fn move_out_of_line(&self, key: &str, ranges: &Dirty) -> io::Result<()> {
        let mut all = Dirty::default();
        let mut base = vec![0u8; INLINE_MAX as usize];
        let n = self.inline.read(key, 0, &mut base)?;
        base.truncate(n);
        all.put(0, &base);
        let mut newer = ranges.clone();
        newer.under(all);
        let extents = self.upload(key, &newer)?;
        self.push(key, MapOp::Write(extents), true);
        Ok(())
    }

    /// A gc document for `blocks` of `key` (collected after the grace
    /// period). A failure leaves them to fsck as orphans: logged, not an
    /// error of the write that is already committed.
    fn record_garbage(&self, key: &str, blocks: &[BlockId]) -> io::Result<()> {
        let Some(first) = blocks.first() else {
            return Ok(());
        };
        let source = json!({
            "file": GC_FILE,
            "n": crate::model::now_ns() / 1_000_000,
            "of": key,
            "blocks": blocks,
        });
        if let Err(e) = self
            .meta
            .put(Idx::Chunks, &format!("gc:{key}:{first}"), &source, None)
        {
            log::warn!(
                "{} superseded blocks of {key} not recorded for collection (fsck finds them): {e}",
                blocks.len()
            );
        }
        Ok(())
    }

    /// Delete the blocks of gc documents older than the grace period, then
    /// the documents: how many blocks. Any mount (and fsck --repair) runs
    /// this; two at once delete the same blocks twice, harmlessly.
    pub(crate) fn collect(&self, grace: Duration) -> io::Result<usize> {
        let cutoff = crate::model::now_ns() / 1_000_000 - grace.as_millis() as i64;
        let q = Query::and(vec![
            Query::term("file", GC_FILE),
            Query::Range {
                field: "n".into(),
                gte: None,
                gt: None,
                lte: Some(cutoff.into()),
                lt: None,
            },
        ]);
        let mut done = 0;
        loop {
            let hits = self
                .meta
                .search(&SearchRequest {
                    index: Idx::Chunks,
                    query: q.clone(),
                    sort: vec![Sort::asc("n")],
                    search_after: None,
                    size: 500,
                    past_own_writes: false,
                })
                .map_err(store_err)?;
            if hits.is_empty() {
                return Ok(done);
            }
            let mut gone = 0;
            for h in &hits {
                let (of, blocks) = gc_blocks(&h.doc);
                self.note(self.blocks.delete(&of, &blocks))?;
                match self.meta.delete(Idx::Chunks, &h.doc.id, None) {
                    Ok(_) | Err(StoreError::NotFound(_)) => gone += 1,
                    Err(e) => return Err(store_err(e)),
                }
                done += blocks.len();
            }
            self.meta.refresh(Idx::Chunks).map_err(store_err)?;
            if gone == 0 {
                return Ok(done);
            }
        }
    }

    /// Every document of the `chunks` index matching `q`, whole.
    fn all_docs(&self, q: Query) -> io::Result<Vec<Doc>> {
        let mut out = Vec::new();
        self.meta
            .scan_pages(
                Idx::Chunks,
                &q,
                &[Sort::asc("file"), Sort::asc("n")],
                500,
                &mut |hits| {
                    out.extend(hits.into_iter().map(|h| h.doc));
                    Ok(true)
                },
            )
            .map_err(store_err)?;
        Ok(out)
    }

    /// The block maps fsck checks the object store against, by content
    /// key: every inode document's, and the legacy documents of files whose
    /// inode holds none. Legacy documents of files whose inode does (a
    /// crash between a commit moving the map and the document's deletion)
    /// are stale: reported, and deleted on `repair` (their blocks are the
    /// inode's or collected).
    fn all_maps(
        &self,
        repair: bool,
        report: &mut StoreAudit,
    ) -> io::Result<Vec<(String, BlockMap)>> {
        let mut maps: HashMap<String, BlockMap> = HashMap::new();
        let mut bad = Vec::new();
        self.meta
            .scan_pages(
                Idx::Inodes,
                &Query::term("kind", "file"),
                &[],
                500,
                &mut |hits| {
                    for h in hits {
                        let key = h.doc.source["content"].as_str().unwrap_or_default();
                        let field = &h.doc.source["map"];
                        if key.is_empty() || field.is_null() {
                            continue;
                        }
                        match parse_map(key, field) {
                            Ok(m) => drop(maps.insert(key.to_string(), m)),
                            Err(e) => bad.push(e.to_string()),
                        }
                    }
                    Ok(true)
                },
            )
            .map_err(store_err)?;
        report.problems.extend(bad);
        for d in self.all_docs(Query::term("n", MAP_N))? {
            let key = d.source["file"].as_str().unwrap_or_default().to_string();
            if maps.contains_key(&key) {
                report.problems.push(format!(
                    "contents {key}: stale block map document {} (the inode holds the map)",
                    d.id
                ));
                if repair {
                    match self.meta.delete(Idx::Chunks, &d.id, None) {
                        Ok(_) | Err(StoreError::NotFound(_)) => report.repaired += 1,
                        Err(e) => return Err(store_err(e)),
                    }
                }
                continue;
            }
            match parse_map(&key, &d.source["map"]) {
                Ok(m) => drop(maps.insert(key, m)),
                Err(e) => report.problems.push(e.to_string()),
            }
        }
        Ok(maps.into_iter().collect())
    }

    /// fsck's check of the object store against the documents: blocks a
    /// map names that are gone (data loss), and blocks nothing names that
    /// are older than the grace period (a crashed upload or commit), which
    /// `repair` deletes, after collecting what gc documents are due.
    pub(crate) fn audit(&self, repair: bool) -> io::Result<StoreAudit> {
        let mut report = StoreAudit::default();
        if repair {
            let n = self.collect(self.grace)?;
            if n > 0 {
                report.repaired += 1;
            }
        }
        self.meta.refresh(Idx::Chunks).map_err(store_err)?;
        self.meta.refresh(Idx::Inodes).map_err(store_err)?;
        let mut referenced: HashMap<String, BTreeSet<BlockId>> = HashMap::new();
        for (key, m) in self.all_maps(repair, &mut report)? {
            referenced.entry(key).or_default().extend(m.blocks());
        }
        for d in self.all_docs(Query::term("file", GC_FILE))? {
            let (of, blocks) = gc_blocks(&d);
            referenced.entry(of).or_default().extend(blocks);
        }
        let listed: Vec<BlockMeta> = self.note(self.blocks.list())?;
        let now = crate::model::now_ns();
        let a = super::blocks::audit(&listed, &referenced, now, self.grace.as_nanos() as i64);
        for (file, block) in &a.missing {
            report.problems.push(format!(
                "contents {file}: block {block} of its map is missing from {} (reads there fail with EIO)",
                self.blocks.describe()
            ));
        }
        if !a.orphans.is_empty() {
            let bytes: u64 = a.orphans.iter().map(|m| m.size).sum();
            report.problems.push(format!(
                "{} orphan block(s) ({bytes} bytes) in {} named by no map, older than the grace period",
                a.orphans.len(),
                self.blocks.describe()
            ));
            if repair {
                let mut by_file: HashMap<&str, Vec<BlockId>> = HashMap::new();
                for m in &a.orphans {
                    by_file.entry(&m.file).or_default().push(m.block);
                }
                for (file, blocks) in by_file {
                    self.note(self.blocks.delete(file, &blocks))?;
                }
                report.repaired += 1;
            }
        }
        Ok(report)
    }

    /// Read from the committed contents and what is staged over them,
    /// without the buffers; with the queued uploads as they were when the
    /// map was taken (the caller lays them over: one that landed since is
    /// in the map, not in the queue).
    fn read_stored(
        &self,
        key: &str,
        off: u64,
        buf: &mut [u8],
    ) -> io::Result<(usize, Vec<(u64, Bytes)>)> {
        self.locate(key)?;
        let (map, ra, queued) = {
            let mut files = self.files.lock();
            let f = files.entry(key.to_string()).or_default();
            let end = off + buf.len() as u64;
            let queued = f
                .queue
                .iter()
                .filter(|u| u.off < end && u.off + u.data.len() as u64 > off)
                .map(|u| (u.off, u.data.clone()))
                .collect();
            (f.read_map(), f.ra.clone(), queued)
        };
        let held = match map {
            Some(map) => {
                let r = self.blocks.read(key, &map, off, buf, &mut ra.lock());
                self.note(r)?
            }
            None => self.inline.read(key, off, buf)?,
        };
        Ok((held, queued))
    }

    /// Delete `key`'s legacy map document, then record its blocks for
    /// collection (a crash in between leaves orphans for fsck, never a map
    /// naming collected blocks).
    fn drop_legacy_map(&self, key: &str) -> io::Result<()> {
        if let Some(map) = self.read_legacy_map(key)? {
            match self.meta.delete(Idx::Chunks, &map_id(key), None) {
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(store_err(e)),
            }
            let blocks: Vec<BlockId> = map.blocks().into_iter().collect();
            return self.record_garbage(key, &blocks);
        }
        Ok(())
    }

    /// Uploads what is buffered, then stages the cut (of blocks) or cuts
    /// the inline chunks.
    fn truncate_locked(&self, key: &str, size: u64) -> io::Result<()> {
        self.write_out_locked(key)?;
        self.locate(key)?;
        let blocks = self.files.lock().get(key).is_some_and(|f| f.in_blocks());
        if blocks {
            self.push(key, MapOp::Truncate(size), false);
        } else {
            self.inline.truncate(key, size)?;
        }
        if let Some(f) = self.files.lock().get_mut(key)
            && f.end.is_some()
        {
            f.end = Some(size);
        }
        Ok(())
    }
}

/// Where a file whose inode holds `map` has its contents: an empty map (a
/// file cut to nothing) means no blocks.
fn in_inode(map: BlockMap) -> Where {
    match map.is_empty() {
        true => Where::Inline,
        false => Where::Map(Arc::new(map)),
    }
}

fn parse_map(key: &str, field: &serde_json::Value) -> io::Result<BlockMap> {
    let extents: Vec<Extent> = serde_json::from_value(field.clone())
        .map_err(|e| io::Error::other(format!("block map of {key}: {e}")))?;
    BlockMap::from_extents(extents)
        .map_err(|e| io::Error::other(format!("block map of {key}: {e}")))
}

fn gc_blocks(doc: &Doc) -> (String, Vec<BlockId>) {
    let of = doc.source["of"].as_str().unwrap_or_default().to_string();
    let blocks = serde_json::from_value(doc.source["blocks"].clone()).unwrap_or_default();
    (of, blocks)
}

impl DataStore for ObjectStore {
    fn read(&self, key: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let (held, queued) = self.read_stored(key, off, buf)?;
        let mut q = 0;
        for (s, data) in queued {
            q = q.max(overlay(s, &data, off, buf));
        }
        let files = self.files.lock();
        let Some(f) = files.get(key) else {
            return Ok(held.max(q));
        };
        let a = f.flushing.overlay(off, buf).max(q);
        let b = f.dirty.overlay(off, buf);
        Ok(held.max(a).max(b))
    }

    /// Buffered. A file in blocks uploads each whole block as soon as it
    /// is buffered, in the background (the writer waits only while the
    /// store has `max_queued` of them in flight), staged in order as they
    /// land: a continuous pipeline, as JuiceFS's. A file not in blocks yet
    /// is written out in the background past FIRST_FLUSH_AT (it moves out
    /// of line; the pipeline follows), and what is not whole
    /// blocks (random writes) past FLUSH_AT; past 2 x FLUSH_AT the writer
    /// waits for that. A failed background upload keeps its bytes buffered
    /// for the next write-out, which the next write starts (and reports).
    fn write(&self, key: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let bs = self.blocks.block_size();
        let (background, wait) = {
            let mut files = self.files.lock();
            while self.queued.load(Ordering::Relaxed) >= self.max_queued {
                self.landed.wait(&mut files);
            }
            let f = files.entry(key.to_string()).or_default();
            f.dirty.put(off, data);
            if let Some(end) = &mut f.end {
                *end = (*end).max(off + data.len() as u64);
            }
            if f.queue.iter().any(|u| matches!(u.result, Some(Err(_)))) {
                drop(files);
                return self.write_out(key);
            }
            // Not while a write-out runs: its op must stage before these.
            if f.in_blocks() && f.flushing.is_empty() && !f.uploading {
                let cut = f.dirty.take_blocks(bs as u64);
                self.enqueue(key, f, cut);
            }
            let at = if f.in_blocks() {
                FLUSH_AT
            } else {
                FIRST_FLUSH_AT
            };
            let start = f.dirty.bytes >= at && !f.uploading;
            f.uploading |= start;
            (start, f.dirty.bytes >= 2 * FLUSH_AT)
        };
        if background && let Some(me) = self.me.upgrade() {
            let key = key.to_string();
            std::thread::spawn(move || {
                if let Err(e) = me.write_out(&key) {
                    log::debug!("background write-out of {key}: {e}");
                }
                if let Some(f) = me.files.lock().get_mut(&key) {
                    f.uploading = false;
                }
            });
        }
        if wait {
            self.write_out(key)?;
        }
        Ok(())
    }

    fn flush(&self, key: &str) -> io::Result<()> {
        self.write_out(key)
    }

    /// Upload what is buffered; what is staged (uploaded, not committed)
    /// is the change to commit in the inode.
    fn stage(&self, key: &str) -> io::Result<Option<MapChange>> {
        self.write_out(key)?;
        Ok(self.files.lock().get(key).and_then(FileState::change))
    }

    /// The ops the change held are committed; then what the new map no
    /// longer names (of the old map, and of blocks uploaded by this change
    /// and overwritten within it) is recorded for collection, the inline
    /// chunks of a file moved out of line go, and so does a legacy map
    /// document (a crash before leaves it stale: the inode's map wins, and
    /// fsck --repair deletes it).
    fn committed(&self, key: &str, change: &MapChange, old: &BlockMap, new: &BlockMap) {
        {
            let mut files = self.files.lock();
            let f = files.entry(key.to_string()).or_default();
            f.staged.retain(|(n, _)| *n > change.upto);
            f.at = in_inode(new.clone());
            f.legacy = false;
            f.from_inline &= !change.from_inline;
            f.restage();
        }
        let mut gone = old.blocks();
        for op in &change.ops {
            if let MapOp::Write(extents) = op {
                gone.extend(extents.iter().map(|e| e.block));
            }
        }
        let kept = new.blocks();
        gone.retain(|b| !kept.contains(b));
        let gone: Vec<BlockId> = gone.into_iter().collect();
        let _ = self.record_garbage(key, &gone);
        if change.from_inline
            && let Err(e) = self.inline.remove_sized(key, INLINE_MAX)
        {
            log::warn!("inline chunks of {key} moved to blocks not deleted (unread now): {e}");
        }
        if change.legacy.is_some() {
            match self.meta.delete(Idx::Chunks, &map_id(key), None) {
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                Err(e) => log::warn!("legacy block map of {key} not deleted (fsck does): {e}"),
            }
        }
    }

    /// After the inode document (and its map) is gone.
    fn removed(&self, key: &str, map: Option<&BlockMap>) {
        if let Some(m) = map {
            let blocks: Vec<BlockId> = m.blocks().into_iter().collect();
            let _ = self.record_garbage(key, &blocks);
        }
    }

    fn stored_bytes(&self, key: &str, known: Option<u64>) -> io::Result<Option<u64>> {
        let map = self.files.lock().get(key).and_then(FileState::read_map);
        match map {
            Some(m) => Ok(Some(m.stored_bytes())),
            _ => self.inline.stored_bytes(key, known),
        }
    }

    fn truncate(&self, key: &str, size: u64) -> io::Result<()> {
        let _w = self.writing[stripe(key)].lock();
        if let Some(f) = self.quiesce(key).get_mut(key) {
            f.dirty.truncate(size);
        }
        self.truncate_locked(key, size)
    }

    fn sync(&self, key: &str) -> io::Result<()> {
        self.write_out(key)?;
        self.meta.sync().map_err(store_err)
    }

    fn remove(&self, key: &str) -> io::Result<()> {
        self.remove_sized(key, u64::MAX)
    }

    /// Blocks staged here and never committed, a legacy map and its
    /// blocks (see `drop_legacy_map`), then the inline chunks. The blocks
    /// of the inode's map go once the inode is deleted (`removed`).
    fn remove_sized(&self, key: &str, size: u64) -> io::Result<()> {
        let _w = self.writing[stripe(key)].lock();
        let f = self.quiesce(key).remove(key);
        if let Some(f) = f {
            let staged: BTreeSet<BlockId> = f
                .staged
                .iter()
                .filter_map(|(_, op)| match op {
                    MapOp::Write(extents) => Some(extents.iter().map(|e| e.block)),
                    MapOp::Truncate(_) => None,
                })
                .flatten()
                .collect();
            self.record_garbage(key, &staged.into_iter().collect::<Vec<_>>())?;
        }
        self.drop_legacy_map(key)?;
        if size == u64::MAX {
            self.inline.remove(key)
        } else {
            self.inline.remove_sized(key, size.min(INLINE_MAX))
        }
    }

    fn release(&self, key: &str) {
        self.inline.release(key);
        let mut files = self.files.lock();
        if files.get(key).is_some_and(|f| f.idle()) {
            files.remove(key);
        }
    }

    /// Each open takes the committed map from the inode document it read
    /// (one version per open, the size's), unless this mount holds
    /// unwritten or uncommitted bytes of the file. No map there: inline, or
    /// a legacy map document (looked for at the first read).
    fn opening(&self, key: &str, size: u64, version: Option<Version>, map: Option<&BlockMap>) {
        self.inline.opening(key, size, version, map);
        let mut files = self.files.lock();
        let f = files.entry(key.to_string()).or_default();
        f.end.get_or_insert(size);
        if f.idle() {
            (f.at, f.inode_seen) = match map {
                Some(m) => (in_inode(m.clone()), true),
                None if size == 0 => (Where::Inline, true),
                None => (Where::Unknown, true),
            };
            f.legacy = false;
            f.small_at_open = (size <= INLINE_MAX).then_some(size);
            f.ra = Arc::new(Mutex::new(ReadAhead::new(READ_AHEAD)));
        }
    }

    fn first_piece(&self, key: &str) -> Option<Piece> {
        self.inline.first_piece(key)
    }

    fn offer(&self, key: &str, piece: Piece, doc: Option<&Doc>, size: u64, version: Version) {
        if size <= INLINE_MAX {
            self.inline.offer(key, piece, doc, size, version)
        }
    }

    fn capacity(&self) -> io::Result<Capacity> {
        self.inline.capacity()
    }

    fn keys(&self) -> io::Result<Vec<String>> {
        let mut keys = self.inline.keys()?;
        keys.retain(|k| k != GC_FILE);
        Ok(keys)
    }

    fn audit(&self, repair: bool) -> io::Result<StoreAudit> {
        ObjectStore::audit(self, repair)
    }
}

/// The collector: every `every`, the blocks superseded longer than the
/// grace period ago go. Runs for the life of the mount.
pub(crate) fn spawn_collector(store: Arc<ObjectStore>, every: Duration) {
    let grace = store.grace;
    std::thread::Builder::new()
        .name("esfs-gc".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                match store.collect(grace) {
                    Ok(0) => {}
                    Ok(n) => log::info!("collected {n} superseded block(s)"),
                    Err(e) => log::info!("block collection postponed: {e}"),
                }
            }
        })
        .expect("spawn the block collector");
}

#[cfg(test)]
mod tests {
    use super::Dirty;

    #[test]
    fn dirty_ranges_merge_and_overlay() {
        let mut d = Dirty::default();
        d.put(10, b"abc");
        d.put(13, b"def");
        d.put(0, b"xy");
        d.put(11, b"ZZZZ");
        assert_eq!(d.ranges.len(), 2);
        assert_eq!(d.bytes, 2 + 6);
        let mut buf = [0u8; 20];
        assert_eq!(d.overlay(0, &mut buf), 16);
        assert_eq!(&buf[..16], b"xy\0\0\0\0\0\0\0\0aZZZZf");
        d.put(1, &[7u8; 12]);
        assert_eq!(d.ranges.len(), 1);
        assert_eq!(d.bytes, 16);
        d.truncate(5);
        assert_eq!(d.bytes, 5);
        let mut older = Dirty::default();
        older.put(3, b"12345");
        d.under(older);
        let mut buf = [0u8; 8];
        assert_eq!(d.overlay(0, &mut buf), 8);
        assert_eq!(&buf, b"x\x07\x07\x07\x07345");
    }

    #[test]
    fn whole_blocks_are_cut_from_the_buffer_the_rest_stays() {
        let mut d = Dirty::default();
        // A stream from 2: no whole block yet, then two, then the tail.
        d.put(2, &[1u8; 5]);
        assert!(d.take_blocks(4).is_empty());
        d.put(7, &[2u8; 8]);
        let blocks = d.take_blocks(4);
        let want: Vec<(u64, Vec<u8>)> = vec![(4, vec![1, 1, 1, 2]), (8, vec![2; 4])];
        assert_eq!(blocks, want);
        assert_eq!(d.bytes, 2 + 3);
        let mut buf = [0u8; 16];
        assert_eq!(d.overlay(0, &mut buf), 15);
        assert_eq!(&buf[..15], &[0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2]);
        // An aligned block alone is taken whole, and the buffer is empty.
        let mut e = Dirty::default();
        e.put(8, &[3u8; 4]);
        assert_eq!(e.take_blocks(4), vec![(8, vec![3u8; 4])]);
        assert!(e.is_empty() && e.bytes == 0);
    }
}
