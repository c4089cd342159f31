//! File contents in S3-compatible object storage (`--data s3://BUCKET/PREFIX`):
//! the bytes as immutable blocks ([`BlockStore`]), and per file one *map
//! document* in the metadata store naming them, committed with the store's
//! version check. Small files stay inline in the metadata store, as chunk
//! documents ([`ChunkStore`]), so a lookup reads them with their inode in one
//! round trip.
//!
//! Documents (all in the `chunks` index, whose searchable fields are `file`
//! and `n`, so no schema change):
//! - `<key>:<n>` (n >= 0): inline contents (see `chunks`), for files that
//!   never grew past [`INLINE_MAX`];
//! - `<key>:map` (`n` = -1): `{"map": [[off, len, "block", at], ...]}`, the
//!   file's committed block map. Once a file has one, it keeps it (even cut
//!   down to a few bytes);
//! - `gc:<key>:<block>` (`file` = [`GC_FILE`], `n` = ms when superseded):
//!   `{"of": key, "blocks": [...]}`, blocks no map names any more, deleted
//!   from the object store after the grace period by any mount's collector
//!   or by `esfs fsck --repair`.
//!
//! Commit protocol: a write-out uploads the buffered bytes as fresh blocks
//! (in parallel), then writes the map document with the version it read
//! (put-if-absent for a first map). On a conflict (another mount committed
//! meanwhile) it re-reads that map, applies the same extents to it (last
//! writer wins per byte range) and tries again; the uploaded blocks stay
//! valid. Then, in a separate write, a gc document for the blocks the new
//! map superseded. So a reader (who reads one map version per open) sees
//! one committed version, and a crash leaves at worst blocks no document
//! names: orphans, whose age is in their name, for fsck.

use super::blocks::{BlockError, BlockId, BlockMap, BlockMeta, BlockStore, Extent, ReadAhead};
use super::chunks::ChunkStore;
use super::{Capacity, DataStore, Piece, StoreAudit};
use crate::store::{Doc, Idx, MetaStore, Query, SearchRequest, Sort, StoreError, Version};
use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Files up to this size stay inline in the metadata store. 64 KiB: below
/// it, one block's PUT and GET (two object-store round trips, each a few ms
/// even on a LAN, plus a map document) cost more than carrying the bytes in
/// a document read with the inode; above it, base64 in a search engine's
/// documents (a third bigger, replicated, merged) stops being cheap.
pub(crate) const INLINE_MAX: u64 = 64 << 10;
/// A file's buffered bytes are uploaded (and committed) once past this:
/// 16 blocks of 4 MiB, two rounds of the parallel uploads, so the slowest
/// PUT of a round delays the next write-out less.
const FLUSH_AT: usize = 64 << 20;
/// Sequential readers prefetch this far ahead.
const READ_AHEAD: u64 = 32 << 20;
/// The `file` of gc documents: never a content key (those are decimal).
pub(crate) const GC_FILE: &str = "~gc";
/// The `n` of map documents (inline chunks are 0, 1, ...).
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
            let (a, b) = ((*s).max(off), (s + v.len() as u64).min(end));
            if a >= b {
                continue;
            }
            buf[(a - off) as usize..(b - off) as usize]
                .copy_from_slice(&v[(a - s) as usize..(b - s) as usize]);
            held = held.max((b - off) as usize);
        }
        held
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

/// Where a file's contents are, as this mount last read or committed it.
#[derive(Clone)]
enum Where {
    /// Not known (read the map document to find out).
    Unknown,
    /// Inline chunk documents; no map document.
    Inline,
    /// A committed map, at this version of its document.
    Map(Arc<BlockMap>, Version),
}

struct FileState {
    at: Where,
    dirty: Dirty,
    /// Ranges being uploaded and committed: still served to reads.
    flushing: Dirty,
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
    /// A background write-out of this file is under way (see `write`).
    uploading: bool,
}

impl Default for FileState {
    fn default() -> Self {
        FileState {
            at: Where::Unknown,
            dirty: Dirty::default(),
            flushing: Dirty::default(),
            end: None,
            small_at_open: None,
            ra: Arc::new(Mutex::new(ReadAhead::new(READ_AHEAD))),
            uploading: false,
        }
    }
}

pub(crate) struct ObjectStore {
    /// Itself, for the background write-outs it starts.
    me: std::sync::Weak<ObjectStore>,
    /// The store itself, no cache in front: a map read is the committed one.
    meta: Arc<dyn MetaStore>,
    blocks: Arc<BlockStore>,
    inline: ChunkStore,
    files: Mutex<HashMap<String, FileState>>,
    /// One write-out, truncate or removal per file at a time, so commits
    /// of one mount land in order.
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
            blocks,
            files: Mutex::new(HashMap::new()),
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

    /// The map document of `key` as stored now: (map, version), None if
    /// there is none.
    fn read_map(&self, key: &str) -> io::Result<Option<(BlockMap, Version)>> {
        let Some(doc) = self
            .meta
            .get(Idx::Chunks, &map_id(key))
            .map_err(store_err)?
        else {
            return Ok(None);
        };
        Ok(Some((parse_map(key, &doc)?, doc.version)))
    }

    /// Where `key`'s contents are, reading what it takes to know.
    fn locate(&self, key: &str) -> io::Result<Where> {
        let (at, small) = {
            let files = self.files.lock();
            match files.get(key) {
                Some(f) => (f.at.clone(), f.small_at_open),
                None => (Where::Unknown, None),
            }
        };
        if !matches!(at, Where::Unknown) {
            return Ok(at);
        }
        // A small file's inline chunk (often read with its inode already)
        // holding exactly its size is its contents: no map to look for.
        if let Some(size) = small.filter(|s| *s > 0) {
            let mut b = vec![0u8; size as usize];
            if self.inline.read(key, 0, &mut b)? == size as usize {
                return Ok(self.settle(key, Where::Inline));
            }
        }
        let found = match self.read_map(key)? {
            Some((m, v)) => Where::Map(Arc::new(m), v),
            None => Where::Inline,
        };
        Ok(self.settle(key, found))
    }

    /// Record where `key` is, unless a commit here said otherwise meanwhile.
    fn settle(&self, key: &str, found: Where) -> Where {
        let mut files = self.files.lock();
        let f = files.entry(key.to_string()).or_default();
        if matches!(f.at, Where::Unknown) {
            f.at = found;
        }
        f.at.clone()
    }

    fn write_out(&self, key: &str) -> io::Result<()> {
        let _w = self.writing[stripe(key)].lock();
        self.write_out_locked(key)
    }

    /// Upload and commit what is buffered of `key` (its write lock held).
    fn write_out_locked(&self, key: &str) -> io::Result<()> {
        let (ranges, end) = {
            let mut files = self.files.lock();
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
        let r = self.commit_ranges(key, &ranges, end);
        let mut files = self.files.lock();
        let f = files.entry(key.to_string()).or_default();
        let flushed = std::mem::take(&mut f.flushing);
        if r.is_err() {
            // Kept for a later flush; what was written since is newer.
            f.dirty.under(flushed);
        }
        r
    }

    fn commit_ranges(&self, key: &str, ranges: &Dirty, end: u64) -> io::Result<()> {
        match self.locate(key)? {
            Where::Inline if end <= INLINE_MAX => {
                for (off, data) in &ranges.ranges {
                    self.inline.write(key, *off, data)?;
                }
                self.inline.flush(key)
            }
            Where::Inline => self.move_out_of_line(key, ranges),
            Where::Map(..) => {
                let extents = self.upload(key, ranges)?;
                self.commit(key, |m| m.write(&extents))
            }
            Where::Unknown => unreachable!("located"),
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
    /// ones become blocks and its first map; then the inline chunks go.
    fn move_out_of_line(&self, key: &str, ranges: &Dirty) -> io::Result<()> {
        let mut all = Dirty::default();
        let mut base = vec![0u8; INLINE_MAX as usize];
        let n = self.inline.read(key, 0, &mut base)?;
        base.truncate(n);
        all.put(0, &base);
        let mut newer = ranges.clone();
        newer.under(all);
        let extents = self.upload(key, &newer)?;
        self.commit(key, |m| m.write(&extents))?;
        self.inline.remove_sized(key, INLINE_MAX)
    }

    /// Commit `change` applied to `key`'s committed map (none: an empty
    /// one) with the version check, re-reading and re-applying on a
    /// conflict; then record what the new map superseded for collection.
    fn commit(&self, key: &str, change: impl Fn(&BlockMap) -> BlockMap) -> io::Result<()> {
        let mut base = match self.locate(key)? {
            Where::Map(m, v) => Some(((*m).clone(), v)),
            _ => None,
        };
        for _ in 0..100 {
            let old = base.as_ref().map(|(m, _)| m.clone()).unwrap_or_default();
            let new = change(&old);
            let source = json!({"file": key, "n": MAP_N, "map": &new});
            let r = match &base {
                Some((_, v)) => self.meta.put(Idx::Chunks, &map_id(key), &source, Some(*v)),
                None => self.meta.create(Idx::Chunks, &map_id(key), &source),
            };
            match r {
                Ok(v) => {
                    self.files.lock().entry(key.to_string()).or_default().at =
                        Where::Map(Arc::new(new.clone()), v);
                    let gone = old.superseded_by(&new);
                    return self.record_garbage(key, &gone);
                }
                Err(StoreError::Conflict(_)) | Err(StoreError::NotFound(_)) => {
                    base = self.read_map(key)?;
                }
                Err(e) => return Err(store_err(e)),
            }
        }
        Err(io::Error::other(format!(
            "block map of {key}: 100 conflicting commits in a row"
        )))
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
        let mut referenced: HashMap<String, BTreeSet<BlockId>> = HashMap::new();
        let maps = self.all_docs(Query::term("n", MAP_N))?;
        for d in &maps {
            let key = d.source["file"].as_str().unwrap_or_default().to_string();
            match parse_map(&key, d) {
                Ok(m) => referenced.entry(key).or_default().extend(m.blocks()),
                Err(e) => report.problems.push(e.to_string()),
            }
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

    /// Read from the committed contents, without the buffers.
    fn read_stored(&self, key: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        match self.locate(key)? {
            Where::Map(map, _) => {
                let ra = self
                    .files
                    .lock()
                    .entry(key.to_string())
                    .or_default()
                    .ra
                    .clone();
                let r = self.blocks.read(key, &map, off, buf, &mut ra.lock());
                self.note(r)
            }
            _ => self.inline.read(key, off, buf),
        }
    }

    /// Delete `key`'s map document, then record its blocks for
    /// collection (a crash in between leaves orphans for fsck, never a map
    /// naming collected blocks).
    fn drop_map(&self, key: &str) -> io::Result<()> {
        while let Some((map, v)) = self.read_map(key)? {
            match self.meta.delete(Idx::Chunks, &map_id(key), Some(v)) {
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                // Another mount committed meanwhile: its map goes instead.
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(store_err(e)),
            }
            let blocks: Vec<BlockId> = map.blocks().into_iter().collect();
            return self.record_garbage(key, &blocks);
        }
        Ok(())
    }

    fn truncate_locked(&self, key: &str, size: u64) -> io::Result<()> {
        self.write_out_locked(key)?;
        match self.locate(key)? {
            // An empty file has no map (so a file opened empty is known to
            // be inline without a read).
            Where::Map(..) if size == 0 => {
                self.drop_map(key)?;
                self.files.lock().entry(key.to_string()).or_default().at = Where::Inline;
            }
            Where::Map(..) => self.commit(key, |m| m.truncate(size))?,
            _ => self.inline.truncate(key, size)?,
        }
        if let Some(f) = self.files.lock().get_mut(key)
            && f.end.is_some()
        {
            f.end = Some(size);
        }
        Ok(())
    }
}

fn parse_map(key: &str, doc: &Doc) -> io::Result<BlockMap> {
    let extents: Vec<Extent> = serde_json::from_value(doc.source["map"].clone())
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
        let held = self.read_stored(key, off, buf)?;
        let files = self.files.lock();
        let Some(f) = files.get(key) else {
            return Ok(held);
        };
        let a = f.flushing.overlay(off, buf);
        let b = f.dirty.overlay(off, buf);
        Ok(held.max(a).max(b))
    }

    /// Buffered; past FLUSH_AT the buffer is written out in the
    /// background while the writer goes on filling the next (a failure
    /// keeps the bytes buffered for the next flush, which reports it);
    /// past 2 x FLUSH_AT the writer waits for it.
    fn write(&self, key: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let (background, wait) = {
            let mut files = self.files.lock();
            let f = files.entry(key.to_string()).or_default();
            f.dirty.put(off, data);
            if let Some(end) = &mut f.end {
                *end = (*end).max(off + data.len() as u64);
            }
            let start = f.dirty.bytes >= FLUSH_AT && !f.uploading;
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

    fn stored_bytes(&self, key: &str, known: Option<u64>) -> io::Result<Option<u64>> {
        let at = self.files.lock().get(key).map(|f| f.at.clone());
        match at {
            Some(Where::Map(m, _)) => Ok(Some(m.stored_bytes())),
            _ => self.inline.stored_bytes(key, known),
        }
    }

    fn truncate(&self, key: &str, size: u64) -> io::Result<()> {
        let _w = self.writing[stripe(key)].lock();
        if let Some(f) = self.files.lock().get_mut(key) {
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

    /// The map and its blocks (see `drop_map`), then the inline chunks.
    fn remove_sized(&self, key: &str, size: u64) -> io::Result<()> {
        let _w = self.writing[stripe(key)].lock();
        self.files.lock().remove(key);
        self.drop_map(key)?;
        if size == u64::MAX {
            self.inline.remove(key)
        } else {
            self.inline.remove_sized(key, size.min(INLINE_MAX))
        }
    }

    fn release(&self, key: &str) {
        self.inline.release(key);
        let mut files = self.files.lock();
        if files
            .get(key)
            .is_some_and(|f| f.dirty.is_empty() && f.flushing.is_empty())
        {
            files.remove(key);
        }
    }

    /// Each open reads the committed map again (one version per open), unless
    /// this mount holds unwritten bytes of the file.
    fn opening(&self, key: &str, size: u64, version: Option<Version>) {
        self.inline.opening(key, size, version);
        let mut files = self.files.lock();
        let f = files.entry(key.to_string()).or_default();
        f.end.get_or_insert(size);
        if f.dirty.is_empty() && f.flushing.is_empty() {
            f.at = if size == 0 {
                Where::Inline
            } else {
                Where::Unknown
            };
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
}
