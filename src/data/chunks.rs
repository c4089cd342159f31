//! File contents as chunk documents in the metadata store's `chunks` index,
//! so one Elasticsearch cluster is the whole deployment and every mount sees
//! the same bytes. Written over [`MetaStore`], so it runs on any backend.
//!
//! A chunk is `CHUNK` bytes of one file (`_id` = `<key>:<n>`, source
//! `{"file", "n", "data": base64}`); a missing chunk is a hole. Writes are
//! buffered per file in memory and written in one bulk on flush (every
//! close), fsync, or when a file's buffer passes `MAX_DIRTY`; reads see the
//! buffer first, then the chunks being written out, then a small cache of
//! clean chunks, then the store.
//!
//! A write-out runs while writes go on (a close of one descriptor while
//! another appends): until the store has its chunks they stay visible as
//! `flushing`, so a write meanwhile builds on them and not on the stored
//! (older) chunk, which would write the bytes in flight back as zeros.

use super::blocks::BlockMap;
use super::{Capacity, DataStore, Piece};
use crate::store::{BulkOp, Doc, Idx, MetaStore, Query, SearchRequest, Sort, StoreError, Version};
use base64::Engine;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::io;
use std::sync::Arc;

/// 1 MiB: a bulk of a few chunks stays far below request limits, and a
/// sequential writer issues one store write per MiB.
pub(crate) const CHUNK: u64 = 1 << 20;
/// Dirty bytes per file before its buffer is written out early.
const MAX_DIRTY: usize = 16;
/// Clean chunks kept for reads.
const CACHE_CHUNKS: usize = 64;
/// Files hash to this many write-out locks and generations: bounded memory
/// whatever the number of files; a collision only costs a wait or a
/// refetch.
const STRIPES: usize = 32;
/// `remove_sized` addresses at most this many chunks (1 GiB) by id.
const ADDRESSED_MAX: u64 = 1024;
/// Bytes of landed chunks kept for the content indexer (see `read_written`),
/// each counted with `KEPT_OVERHEAD`.
const WRITTEN_BYTES: usize = 8 << 20;
/// What keeping a chunk costs beside its bytes (its key, map node and
/// `Arc`, about 350 bytes in heap): counted, so that a tree of one-line
/// files stays within the bound (100 000 of them: 23 MiB of heap for 4 MB of bytes).
const KEPT_OVERHEAD: usize = 256;
/// Offered chunks kept for opens (see `DataStore::offer`); a lookup offers
/// only small files' (see `Fs::lookup`), so this bounds a few MiB.
const OFFERED_MAX: usize = 256;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

type Chunks = BTreeMap<u64, Arc<Vec<u8>>>;

#[derive(Default)]
struct State {
    /// key -> chunk number -> contents (possibly shorter than CHUNK).
    /// Shared with readers; a write copies a chunk a reader still holds.
    dirty: HashMap<String, Chunks>,
    /// Chunks of a write-out in progress, until the store has them.
    flushing: HashMap<String, Chunks>,
    clean: HashMap<(String, u64), Arc<Vec<u8>>>,
    lru: VecDeque<(String, u64)>,
    /// Per stripe, bumped whenever stored chunks change (a write-out
    /// landed, a truncate): a chunk fetched before is not trusted.
    generation: [u64; STRIPES],
    /// Stored length of each dirty chunk before it turned dirty.
    was: HashMap<(String, u64), usize>,
    /// Bytes stored per key, counted as chunks are written and deleted
    /// (see `stored_bytes`): st_blocks without a search per stat.
    stored: HashMap<String, Stored>,
    /// Per open key, an offset nothing is stored at or past (the file's
    /// size when opened, raised by every write, set by truncates): a write
    /// there builds its chunk from nothing instead of fetching it (see
    /// `holds_at_most`).
    ends: HashMap<String, u64>,
    /// Chunks this mount's write-outs landed, oldest first, for the content
    /// indexer's read soon after a close (`read_written`): at most
    /// `WRITTEN_BYTES`, dropped when the stored chunks change otherwise.
    /// Per key, so dropping a file's is one removal whatever is kept.
    written: HashMap<String, Chunks>,
    /// Keys by first landing, for eviction. A key consumed and kept again
    /// appears twice: the older place only evicts it early, and the queue
    /// is compacted when it outgrows the map.
    written_order: VecDeque<String>,
    written_bytes: usize,
    /// Chunk 0 of small files, read by a lookup with their inode (see
    /// `DataStore::offer`), until an open of that inode version adopts it.
    offered: HashMap<String, Offered>,
    offered_order: VecDeque<String>,
    /// Per key cut to nothing in memory (see `DataStore::truncate_open`):
    /// its stored chunks `0..n`, deleted by id in its next write-out (those
    /// it rewrites are replaced instead). The key reads as empty meanwhile
    /// (its end is 0).
    doomed: HashMap<String, u64>,
    /// Such deletes handed to the caller to send with the file's size
    /// (see `DataStore::ride_with_size`), until it says how they went: a
    /// write-out of the key waits, or its chunks could land first and be
    /// deleted by them.
    cutting: HashMap<String, u64>,
}

struct Offered {
    data: Arc<Vec<u8>>,
    /// The inode document's version it was read with.
    version: Version,
    /// The stripe's generation before it was read.
    mark: u64,
}

/// What this mount knows of a key's stored bytes.
enum Stored {
    /// Changed by this much since the figure in the inode document.
    Delta(i64),
    Exact(u64),
}

impl State {
    fn count_stored(&mut self, key: &str, by: i64) {
        let e = self
            .stored
            .entry(key.to_string())
            .or_insert(Stored::Delta(0));
        *e = match *e {
            Stored::Delta(d) => Stored::Delta(d + by),
            Stored::Exact(b) => Stored::Exact((b as i64 + by).max(0) as u64),
        };
    }

    /// The newest contents of chunk `n` held in memory.
    fn current(&self, key: &str, n: u64) -> Option<Arc<Vec<u8>>> {
        [&self.dirty, &self.flushing]
            .into_iter()
            .find_map(|m| m.get(key).and_then(|d| d.get(&n)))
            .or_else(|| self.clean.get(&(key.to_string(), n)))
            .cloned()
    }

    fn keep_written(&mut self, key: &str, n: u64, data: Arc<Vec<u8>>) {
        let chunks = self.written.entry(key.to_string()).or_default();
        if chunks.is_empty() {
            self.written_order.push_back(key.to_string());
        }
        self.written_bytes += kept_weight(&data);
        if let Some(old) = chunks.insert(n, data) {
            self.written_bytes -= kept_weight(&old);
        }
        while self.written_bytes > WRITTEN_BYTES {
            let Some(k) = self.written_order.pop_front() else {
                break;
            };
            self.forget_written(&k);
        }
        if self.written_order.len() > 2 * self.written.len() + 64 {
            let written = &self.written;
            self.written_order.retain(|k| written.contains_key(k));
        }
    }

    fn forget_written(&mut self, key: &str) {
        if let Some(chunks) = self.written.remove(key) {
            self.written_bytes -= chunks.values().map(kept_weight).sum::<usize>();
        }
    }

    /// Chunk `n` of `key` as kept for `read_written`, given up.
    fn take_written(&mut self, key: &str, n: u64) -> Option<Arc<Vec<u8>>> {
        let chunks = self.written.get_mut(key)?;
        let data = chunks.remove(&n)?;
        if chunks.is_empty() {
            self.written.remove(key);
        }
        self.written_bytes -= kept_weight(&data);
        Some(data)
    }

    fn cache(&mut self, key: &str, n: u64, data: Arc<Vec<u8>>) {
        if self.clean.insert((key.to_string(), n), data).is_none() {
            self.lru.push_back((key.to_string(), n));
        }
        while self.lru.len() > CACHE_CHUNKS {
            if let Some(old) = self.lru.pop_front() {
                self.clean.remove(&old);
            }
        }
    }
}

pub(crate) struct ChunkStore {
    store: Arc<dyn MetaStore>,
    state: Mutex<State>,
    /// Signalled when a key's `cutting` ends.
    cut_done: parking_lot::Condvar,
    /// One write-out (or truncate) per file at a time: two closes' bulks
    /// could otherwise land in the wrong order, older contents last.
    writing: [Mutex<()>; STRIPES],
}

/// The bytes of a file of `size` bytes held whole in chunk 0's document
/// `doc` (absent: none), as read for `piece`; None when they are not
/// exactly those (a larger file, a sparse tail, another mount's write-out
/// straddled): the read then fetches.
fn whole_piece(key: &str, piece: &Piece, doc: Option<&Doc>, size: u64) -> Option<Vec<u8>> {
    if size > CHUNK || piece.id != chunk_id(key, 0) {
        return None;
    }
    let data = match doc {
        Some(d) => B64
            .decode(d.source["data"].as_str().unwrap_or_default())
            .ok()?,
        None => Vec::new(),
    };
    (data.len() as u64 == size).then_some(data)
}

/// A kept chunk's weight against `WRITTEN_BYTES`.
fn kept_weight(data: &Arc<Vec<u8>>) -> usize {
    data.len() + KEPT_OVERHEAD
}

fn chunk_id(key: &str, n: u64) -> String {
    format!("{key}:{n}")
}

fn stripe(key: &str) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % STRIPES as u64) as usize
}

fn io_err(e: StoreError) -> io::Error {
    io::Error::other(e)
}

impl ChunkStore {
    pub(crate) fn new(store: Arc<dyn MetaStore>) -> ChunkStore {
        ChunkStore {
            store,
            state: Mutex::new(State::default()),
            cut_done: parking_lot::Condvar::new(),
            writing: std::array::from_fn(|_| Mutex::new(())),
        }
    }

    /// Chunk `n` as stored.
    fn fetch(&self, key: &str, n: u64) -> io::Result<Vec<u8>> {
        match self
            .store
            .get(Idx::Chunks, &chunk_id(key, n))
            .map_err(io_err)?
        {
            Some(doc) => B64
                .decode(doc.source["data"].as_str().unwrap_or_default())
                .map_err(|e| io::Error::other(format!("corrupt chunk {key}:{n}: {e}"))),
            None => Ok(Vec::new()),
        }
    }

    /// Run `f` on the newest contents of chunk `n`, under the state lock
    /// (so a write can buffer its change before any write-out moves on).
    /// A chunk past what the file is known to hold is empty, unread.
    fn with_chunk<T>(
        &self,
        key: &str,
        n: u64,
        f: impl FnOnce(&mut State, Arc<Vec<u8>>) -> T,
    ) -> io::Result<T> {
        let s = stripe(key);
        let mut fetched = None;
        loop {
            let mut st = self.state.lock();
            if let Some(c) = st.current(key, n) {
                return Ok(f(&mut st, c));
            }
            if st.ends.get(key).is_some_and(|end| n * CHUNK >= *end) {
                return Ok(f(&mut st, Arc::new(Vec::new())));
            }
            // A fetch that overlapped a write-out may predate its chunks.
            if let Some((generation, data)) = fetched.take()
                && generation == st.generation[s]
            {
                st.cache(key, n, Arc::clone(&data));
                return Ok(f(&mut st, data));
            }
            let generation = st.generation[s];
            drop(st);
            fetched = Some((generation, Arc::new(self.fetch(key, n)?)));
        }
    }

    /// `buf` filled from offset `off`, chunk `n` as `chunk(n)` gives it;
    /// returns how many bytes the chunks hold (past a chunk's end is a
    /// hole: the caller's buffer stays zero).
    fn read_chunks(
        &self,
        off: u64,
        buf: &mut [u8],
        mut chunk: impl FnMut(u64) -> io::Result<Arc<Vec<u8>>>,
    ) -> io::Result<usize> {
        let mut done = 0usize;
        let mut held = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let (n, within) = (pos / CHUNK, (pos % CHUNK) as usize);
            let want = (buf.len() - done).min(CHUNK as usize - within);
            let data = chunk(n)?;
            if within < data.len() {
                let k = want.min(data.len() - within);
                buf[done..done + k].copy_from_slice(&data[within..within + k]);
                held = done + k;
            }
            done += want;
        }
        Ok(held)
    }

    fn forget_clean(&self, key: &str) {
        let mut st = self.state.lock();
        st.clean.retain(|(k, _), _| k != key);
        st.lru.retain(|(k, _)| k != key);
    }

    /// `lone_cut`: a truncate in memory with nothing written after it is
    /// sent alone too (else it waits for `ride_with_size`).
    fn write_out(&self, key: &str, lone_cut: bool) -> io::Result<()> {
        let _w = self.writing[stripe(key)].lock();
        self.write_out_locked(key, lone_cut)
    }

    /// Write the dirty chunks of `key` in one bulk (its write-out lock
    /// held), with the deletes of the chunks a truncate in memory cut.
    fn write_out_locked(&self, key: &str, lone_cut: bool) -> io::Result<()> {
        let (chunks, doomed) = {
            let mut st = self.state.lock();
            while st.cutting.contains_key(key) {
                self.cut_done.wait(&mut st);
            }
            let cut_alone = lone_cut && st.doomed.contains_key(key);
            if !st.dirty.contains_key(key) && !cut_alone {
                return Ok(());
            }
            let doomed = st.doomed.remove(key).unwrap_or(0);
            let chunks = st.dirty.remove(key).unwrap_or_default();
            st.flushing.insert(key.to_string(), chunks.clone());
            (chunks, doomed)
        };
        let mut ops: Vec<BulkOp> = chunks
            .iter()
            .map(|(n, data)| BulkOp::Index {
                index: Idx::Chunks,
                id: chunk_id(key, *n),
                // `len`: what a truncate deleting the chunk subtracts.
                source: json!({"file": key, "n": n, "len": data.len(), "data": B64.encode(&**data)}),
                if_version: None,
            })
            .collect();
        let written = ops.len();
        ops.extend(
            (0..doomed)
                .filter(|n| !chunks.contains_key(n))
                .map(|n| BulkOp::Delete {
                    index: Idx::Chunks,
                    id: chunk_id(key, n),
                    if_version: None,
                }),
        );
        let failed = match self.store.bulk(ops) {
            // A cut chunk that was never stored is no failure.
            Ok(rs) => rs.into_iter().enumerate().find_map(|(i, r)| match r {
                Err(StoreError::NotFound(_)) if i >= written => None,
                r => r.err(),
            }),
            Err(e) => Some(e),
        };
        let mut st = self.state.lock();
        st.flushing.remove(key);
        if let Some(e) = failed {
            // Keep the data buffered so a later flush can retry; a chunk
            // written since was built on this one and is newer. The cut
            // goes again too.
            let d = st.dirty.entry(key.to_string()).or_default();
            for (n, data) in chunks {
                d.entry(n).or_insert(data);
            }
            if doomed > 0 {
                let n = st.doomed.entry(key.to_string()).or_default();
                *n = (*n).max(doomed);
            }
            return Err(io_err(e));
        }
        st.generation[stripe(key)] += 1;
        for (n, data) in chunks {
            let k = (key.to_string(), n);
            let was = st.was.remove(&k).unwrap_or(0);
            st.count_stored(key, data.len() as i64 - was as i64);
            if let Some(c) = st.clean.get_mut(&k) {
                *c = Arc::clone(&data);
            }
            st.keep_written(key, n, data);
        }
        Ok(())
    }

    /// Ids (and stored lengths) of every stored chunk of `key` at or after
    /// chunk `from`.
    fn stored_chunks(&self, key: &str, from: u64) -> io::Result<Vec<(u64, String, u64)>> {
        let mut out = Vec::new();
        let q = Query::and(vec![
            Query::term("file", key),
            Query::Range {
                field: "n".into(),
                gte: Some(from.into()),
                gt: None,
                lte: None,
                lt: None,
            },
        ]);
        self.chunk_rows(q, &["n", "len"], 1, |row| {
            if let Some(n) = row[0].as_u64() {
                // Chunks written before `len` was: counted as full.
                out.push((n, chunk_id(key, n), row[1].as_u64().unwrap_or(CHUNK)));
            }
        })?;
        Ok(out)
    }

    /// Pages through the chunks matching `q` in the order of `fields` (which
    /// identify a chunk), reading only those fields: a chunk's source is
    /// its data, and a search for a 1 GiB file's chunks with their sources
    /// was a 1.4 GB reply, past the request timeout (the delete then
    /// failed with EIO and left the chunks behind).
    /// `fields` past the `sorted` first ones are only read (unmapped).
    fn chunk_rows(
        &self,
        q: Query,
        fields: &[&str],
        sorted: usize,
        mut f: impl FnMut(&[Value]),
    ) -> io::Result<()> {
        const PAGE: usize = 1000;
        let mut after = None;
        loop {
            let req = SearchRequest {
                past_own_writes: false,
                index: Idx::Chunks,
                query: q.clone(),
                sort: fields[..sorted].iter().map(|s| Sort::asc(s)).collect(),
                search_after: after.take(),
                size: PAGE,
            };
            let rows = self.store.search_fields(&req, fields).map_err(io_err)?;
            rows.iter().for_each(|r| f(r));
            if rows.len() < PAGE {
                return Ok(());
            }
            after = rows.last().map(|r| r[..sorted].to_vec());
        }
    }

    /// Stored chunks changed behind the buffers: drop what was cached or
    /// fetched of `key` before.
    fn stored_changed(&self, key: &str) {
        self.forget_clean(key);
        let mut st = self.state.lock();
        st.generation[stripe(key)] += 1;
        st.forget_written(key);
    }

    /// Unwritten bytes of a file being removed: gone with it. Returns how
    /// many chunks a truncate in memory had cut and not deleted yet (the
    /// removal deletes them).
    fn drop_buffers(&self, key: &str) -> u64 {
        let mut st = self.state.lock();
        st.dirty.remove(key);
        st.was.retain(|(k, _), _| k != key);
        st.forget_written(key);
        let cutting = st.cutting.get(key).copied().unwrap_or(0);
        st.doomed.remove(key).unwrap_or(0).max(cutting)
    }

    fn truncate_locked(&self, key: &str, size: u64) -> io::Result<()> {
        self.write_out_locked(key, true)?;
        // Until the chunks past `size` are gone below, what is stored may
        // reach further: no end is trusted meanwhile.
        let known = self.state.lock().ends.remove(key).is_some();
        let keep = size.div_ceil(CHUNK); // chunks [0, keep) survive
        let doomed = self.stored_chunks(key, keep)?;
        if !doomed.is_empty() {
            let freed: u64 = doomed.iter().map(|(_, _, len)| len).sum();
            let ops = doomed
                .into_iter()
                .map(|(_, id, _)| BulkOp::Delete {
                    index: Idx::Chunks,
                    id,
                    if_version: None,
                })
                .collect();
            let results = self.store.bulk(ops);
            self.stored_changed(key);
            for r in results.map_err(io_err)? {
                match r {
                    Ok(_) | Err(StoreError::NotFound(_)) => {}
                    Err(e) => return Err(io_err(e)),
                }
            }
            self.state.lock().count_stored(key, -(freed as i64));
        }
        // Cut the last kept chunk so bytes past `size` read as zeros if the
        // file grows again.
        if !size.is_multiple_of(CHUNK) {
            let n = size / CHUNK;
            let cut = (size % CHUNK) as usize;
            let cutting = self.with_chunk(key, n, |st, data| {
                let long = data.len() > cut;
                if long {
                    st.was.insert((key.to_string(), n), data.len());
                    st.dirty
                        .entry(key.to_string())
                        .or_default()
                        .insert(n, Arc::new(data[..cut].to_vec()));
                }
                long
            })?;
            if cutting {
                self.write_out_locked(key, true)?;
            }
        }
        self.forget_clean(key);
        if known {
            self.state.lock().ends.insert(key.to_string(), size);
        }
        Ok(())
    }
}

impl DataStore for ChunkStore {
    fn read(&self, key: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.read_chunks(off, buf, |n| self.with_chunk(key, n, |_, c| c))
    }

    fn write(&self, key: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let pos = off + done as u64;
            let (n, within) = (pos / CHUNK, (pos % CHUNK) as usize);
            let k = (data.len() - done).min(CHUNK as usize - within);
            self.with_chunk(key, n, |st, base| {
                let State {
                    dirty, was, ends, ..
                } = st;
                // Under the lock that makes the chunk dirty: a write-out
                // then a write by another thread must not find this chunk
                // past the known end and build it from nothing.
                if let Some(end) = ends.get_mut(key) {
                    *end = (*end).max(pos + k as u64);
                }
                let chunk = dirty
                    .entry(key.to_string())
                    .or_default()
                    .entry(n)
                    .or_insert_with(|| {
                        was.insert((key.to_string(), n), base.len());
                        base
                    });
                let chunk = Arc::make_mut(chunk);
                if chunk.len() < within + k {
                    chunk.resize(within + k, 0);
                }
                chunk[within..within + k].copy_from_slice(&data[done..done + k]);
            })?;
            done += k;
        }
        let over = self
            .state
            .lock()
            .dirty
            .get(key)
            .is_some_and(|d| d.len() > MAX_DIRTY);
        if over {
            self.write_out(key, true)?;
        }
        Ok(())
    }

    /// Close and fsync persist the size after it: a cut alone rides in
    /// that bulk (see `ride_with_size`).
    fn flush(&self, key: &str) -> io::Result<()> {
        self.write_out(key, false)
    }

    /// The deletes of a truncate in memory when nothing was written after
    /// it (`: > f`, or the close of `echo x > f`'s first descriptor, which
    /// a shell's dup2 closes before it writes).
    fn ride_with_size(&self, key: &str) -> Vec<BulkOp> {
        let mut st = self.state.lock();
        if st.dirty.contains_key(key) || st.cutting.contains_key(key) {
            return Vec::new();
        }
        let Some(n) = st.doomed.remove(key) else {
            return Vec::new();
        };
        st.cutting.insert(key.to_string(), n);
        (0..n)
            .map(|i| BulkOp::Delete {
                index: Idx::Chunks,
                id: chunk_id(key, i),
                if_version: None,
            })
            .collect()
    }

    fn sent_with_size(&self, key: &str, landed: bool) {
        let mut st = self.state.lock();
        if let Some(n) = st.cutting.remove(key) {
            if landed {
                st.generation[stripe(key)] += 1;
            } else {
                let d = st.doomed.entry(key.to_string()).or_default();
                *d = (*d).max(n);
            }
        }
        self.cut_done.notify_all();
    }

    fn truncate(&self, key: &str, size: u64) -> io::Result<()> {
        let _w = self.writing[stripe(key)].lock();
        self.truncate_locked(key, size)
    }

    /// To nothing, of a key open here whose end is known: nothing is
    /// sent now. The key reads as empty from here on (its end is 0), what
    /// was buffered goes, and the chunks stored below the end (`0..n`)
    /// are deleted by id in the next write-out, in the bulk that writes
    /// what came after (`echo x > f`: one bulk, where a truncate that finds
    /// the chunks costs a refresh, a search and a bulk of deletes). Chunks
    /// past the end (a writer that died before its size was written) are
    /// not addressed: a later truncate's search deletes them.
    fn truncate_open(&self, key: &str, size: u64) -> io::Result<bool> {
        if size != 0 {
            return Ok(false);
        }
        // After any write-out under way: its chunks are among those cut.
        let _w = self.writing[stripe(key)].lock();
        let mut st = self.state.lock();
        let Some(&end) = st.ends.get(key) else {
            return Ok(false);
        };
        let n = end
            .div_ceil(CHUNK)
            .max(st.doomed.get(key).copied().unwrap_or(0));
        if n > ADDRESSED_MAX {
            return Ok(false);
        }
        st.dirty.remove(key);
        st.was.retain(|(k, _), _| k != key);
        st.clean.retain(|(k, _), _| k != key);
        st.lru.retain(|(k, _)| k != key);
        st.forget_written(key);
        st.generation[stripe(key)] += 1;
        st.ends.insert(key.to_string(), 0);
        // What is stored once the cut lands; writes count from there.
        st.stored.insert(key.to_string(), Stored::Exact(0));
        if n > 0 {
            st.doomed.insert(key.to_string(), n);
        }
        Ok(true)
    }

    fn sync(&self, key: &str) -> io::Result<()> {
        self.write_out(key, true)?;
        self.store.sync().map_err(io_err)
    }

    fn remove(&self, key: &str) -> io::Result<()> {
        let _w = self.writing[stripe(key)].lock();
        self.drop_buffers(key);
        self.truncate_locked(key, 0)?;
        self.state.lock().stored.remove(key);
        Ok(())
    }

    /// The chunks of a file of `size` bytes are `<key>:0 ..`: deleted by id
    /// in one bulk (none for an empty file), without the search and the
    /// refresh before it that finding them costs (and that a near-real-time
    /// index could answer incompletely). A larger (likely sparse) file is
    /// searched instead of addressing a million absent chunks.
    fn remove_sized(&self, key: &str, size: u64) -> io::Result<()> {
        let n = size.div_ceil(CHUNK);
        if n > ADDRESSED_MAX {
            return self.remove(key);
        }
        let _w = self.writing[stripe(key)].lock();
        let n = n.max(self.drop_buffers(key));
        if n > 0 {
            let ops = (0..n)
                .map(|i| BulkOp::Delete {
                    index: Idx::Chunks,
                    id: chunk_id(key, i),
                    if_version: None,
                })
                .collect();
            let results = self.store.bulk(ops);
            self.stored_changed(key);
            for r in results.map_err(io_err)? {
                match r {
                    Ok(_) | Err(StoreError::NotFound(_)) => {}
                    Err(e) => return Err(io_err(e)),
                }
            }
        }
        self.forget_clean(key);
        self.state.lock().stored.remove(key);
        Ok(())
    }

    fn removal_ops(&self, key: &str, size: u64) -> Option<Vec<BulkOp>> {
        let n = size.div_ceil(CHUNK);
        if n > ADDRESSED_MAX {
            return None;
        }
        // After any write-out of the key under way: nothing lands after the
        // caller's deletes. (A removed key is never used again.)
        let _w = self.writing[stripe(key)].lock();
        let n = n.max(self.drop_buffers(key));
        self.stored_changed(key);
        self.state.lock().stored.remove(key);
        Some(
            (0..n)
                .map(|i| BulkOp::Delete {
                    index: Idx::Chunks,
                    id: chunk_id(key, i),
                    if_version: None,
                })
                .collect(),
        )
    }

    /// Counted from the inode's figure (`known`) as this mount writes and
    /// deletes chunks: the stored chunks' lengths, buffered writes not yet.
    fn stored_bytes(&self, key: &str, known: Option<u64>) -> io::Result<Option<u64>> {
        let mut st = self.state.lock();
        let Some(s) = st.stored.get_mut(key) else {
            return Ok(known);
        };
        Ok(match (&*s, known) {
            (Stored::Exact(b), _) => Some(*b),
            (Stored::Delta(d), Some(k)) => {
                let b = (k as i64 + d).max(0) as u64;
                *s = Stored::Exact(b);
                Some(b)
            }
            // A file from before the figure was kept: unknown.
            (Stored::Delta(_), None) => None,
        })
    }

    fn release(&self, key: &str) {
        self.forget_clean(key);
        let mut st = self.state.lock();
        // Written back with the inode (its release follows a persist).
        st.stored.remove(key);
        st.ends.remove(key);
    }

    fn opening(&self, key: &str, size: u64, version: Option<Version>, _map: Option<&BlockMap>) {
        let mut st = self.state.lock();
        st.ends.entry(key.to_string()).or_insert(size);
        if let Some(o) = st.offered.remove(key) {
            st.offered_order.retain(|k| k != key);
            // Read with this very inode version, and nothing of the file
            // written here since: the file's contents as that inode says.
            if version == Some(o.version)
                && o.mark == st.generation[stripe(key)]
                && st.current(key, 0).is_none()
            {
                st.cache(key, 0, o.data);
            }
        }
    }

    fn first_piece(&self, key: &str) -> Option<Piece> {
        let st = self.state.lock();
        if st.current(key, 0).is_some() || st.offered.contains_key(key) {
            return None;
        }
        Some(Piece {
            index: Idx::Chunks,
            id: chunk_id(key, 0),
            mark: st.generation[stripe(key)],
        })
    }

    fn offer(&self, key: &str, piece: Piece, doc: Option<&Doc>, size: u64, version: Version) {
        let Some(data) = whole_piece(key, &piece, doc, size) else {
            return;
        };
        let mut st = self.state.lock();
        if st.generation[stripe(key)] != piece.mark {
            return;
        }
        let o = Offered {
            data: Arc::new(data),
            version,
            mark: piece.mark,
        };
        if st.offered.insert(key.to_string(), o).is_none() {
            st.offered_order.push_back(key.to_string());
        }
        while st.offered_order.len() > OFFERED_MAX {
            if let Some(k) = st.offered_order.pop_front() {
                st.offered.remove(&k);
            }
        }
    }

    fn written_piece(&self, key: &str, size: u64) -> Option<Piece> {
        let st = self.state.lock();
        let held = st.written.get(key).is_some_and(|c| c.contains_key(&0));
        if !(1..=CHUNK).contains(&size) || held || st.current(key, 0).is_some() {
            return None;
        }
        Some(Piece {
            index: Idx::Chunks,
            id: chunk_id(key, 0),
            mark: st.generation[stripe(key)],
        })
    }

    fn offer_written(&self, key: &str, piece: Piece, doc: Option<&Doc>, size: u64) {
        let Some(data) = whole_piece(key, &piece, doc, size) else {
            return;
        };
        let mut st = self.state.lock();
        // A write-out or truncate since it was named: let the read fetch.
        if st.generation[stripe(key)] == piece.mark {
            st.keep_written(key, 0, Arc::new(data));
        }
    }

    fn read_written(&self, key: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.read_chunks(off, buf, |n| {
            let landed = self.state.lock().take_written(key, n);
            match landed {
                Some(data) => Ok(data),
                // Not landed here lately: as any read.
                None => self.with_chunk(key, n, |_, c| c),
            }
        })
    }

    /// The cluster's capacity is not ours to know; report a large constant
    /// so tools see free space, and count nothing as used here.
    fn capacity(&self) -> io::Result<Capacity> {
        Ok(Capacity {
            total_bytes: 1 << 50,
            free_bytes: 1 << 50,
            avail_bytes: 1 << 50,
            free_files: 1 << 32,
        })
    }

    fn keys(&self) -> io::Result<Vec<String>> {
        let mut keys = std::collections::BTreeSet::new();
        self.chunk_rows(Query::MatchAll, &["file", "n"], 2, |row| {
            if let Some(k) = row[0].as_str() {
                keys.insert(k.to_string());
            }
        })?;
        Ok(keys.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;

    fn store() -> (tempfile::TempDir, ChunkStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = EmbeddedStore::open(dir.path()).unwrap();
        (dir, ChunkStore::new(Arc::new(s)))
    }

    use crate::store::gated::Gated;

    fn gated() -> (tempfile::TempDir, Arc<Gated>, Arc<ChunkStore>) {
        let dir = tempfile::tempdir().unwrap();
        let g = Arc::new(Gated::open(dir.path()));
        let cs = Arc::new(ChunkStore::new(g.clone()));
        (dir, g, cs)
    }

    /// What another mount (nothing buffered or cached) reads.
    fn stored(g: &Arc<Gated>, key: &str, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        ChunkStore::new(g.clone()).read(key, 0, &mut b).unwrap();
        b
    }

    /// An appender's write while a close writes the file's chunks out (the
    /// bulk in flight): it lost the bytes in flight, which read and were
    /// stored as zeros.
    #[test]
    fn a_write_during_a_write_out_keeps_the_bytes_in_flight() {
        let (_d, g, cs) = gated();
        cs.write("1", 0, b"a").unwrap();
        let (stopped, go) = g.arm("bulk", None);
        let closer = std::thread::spawn({
            let cs = cs.clone();
            move || cs.flush("1")
        });
        stopped.recv().unwrap();
        cs.write("1", 1, b"b").unwrap();
        let mut b = [0u8; 2];
        cs.read("1", 0, &mut b).unwrap();
        assert_eq!(&b, b"ab", "read during the write-out");
        go.send(()).unwrap();
        closer.join().unwrap().unwrap();
        cs.flush("1").unwrap();
        assert_eq!(stored(&g, "1", 2), b"ab");
    }

    /// Two closes' write-outs of one file: the later one's bulk must not
    /// land first and be overwritten by the older contents.
    #[test]
    fn write_outs_of_a_file_land_in_order() {
        let (_d, g, cs) = gated();
        cs.write("1", 0, b"a").unwrap();
        let (stopped, go) = g.arm("bulk", None);
        let first = std::thread::spawn({
            let cs = cs.clone();
            move || cs.flush("1")
        });
        stopped.recv().unwrap();
        cs.write("1", 1, b"b").unwrap();
        let second = std::thread::spawn({
            let cs = cs.clone();
            move || cs.flush("1")
        });
        // It waits for the first; if it did not, give it the time to land.
        let t = std::time::Instant::now();
        while !second.is_finished() && t.elapsed() < std::time::Duration::from_millis(300) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        go.send(()).unwrap();
        first.join().unwrap().unwrap();
        second.join().unwrap().unwrap();
        assert_eq!(stored(&g, "1", 2), b"ab");
    }

    /// A write that fetched the chunk before another write's write-out
    /// landed must not build on what it fetched.
    #[test]
    fn a_chunk_fetched_across_a_write_out_is_fetched_again() {
        let (_d, g, cs) = gated();
        let (stopped, go) = g.arm("get", None);
        let writer = std::thread::spawn({
            let cs = cs.clone();
            move || cs.write("1", 1, b"b")
        });
        stopped.recv().unwrap();
        cs.write("1", 0, b"a").unwrap();
        cs.flush("1").unwrap();
        // As a close's release does: the landed chunk is not cached.
        cs.release("1");
        go.send(()).unwrap();
        writer.join().unwrap().unwrap();
        cs.flush("1").unwrap();
        assert_eq!(stored(&g, "1", 2), b"ab");
        let mut b = [0u8; 2];
        cs.read("1", 0, &mut b).unwrap();
        assert_eq!(&b, b"ab");
    }

    #[test]
    fn writes_reads_holes_and_truncate_across_chunks() {
        let (_d, cs) = store();
        let big: Vec<u8> = (0..(3 * CHUNK as usize + 100))
            .map(|i| (i % 251) as u8)
            .collect();
        cs.write("7", 10, &big).unwrap();
        cs.flush("7").unwrap();
        let mut buf = vec![1u8; big.len() + 10];
        cs.read("7", 0, &mut buf).unwrap();
        assert_eq!(
            &buf[..10],
            &[0u8; 10],
            "bytes before the first write read as zeros"
        );
        assert_eq!(&buf[10..], &big[..]);
        // Sparse: a write far away leaves untouched chunks absent.
        cs.write("7", 100 * CHUNK, b"end").unwrap();
        cs.flush("7").unwrap();
        assert_eq!(cs.stored_chunks("7", 4).unwrap().len(), 1);
        // Truncate into chunk 1, then grow: the cut bytes read as zeros.
        cs.truncate("7", CHUNK + 5).unwrap();
        assert!(cs.stored_chunks("7", 2).unwrap().is_empty());
        let mut b = vec![9u8; 20];
        let held = cs.read("7", CHUNK, &mut b).unwrap();
        assert_eq!(held, 5);
        assert_eq!(&b[..5], &big[CHUNK as usize - 10..CHUNK as usize - 5]);
        cs.remove("7").unwrap();
        assert!(cs.keys().unwrap().is_empty());
    }

    /// A truncate to nothing of an open file (`echo x > f`) waits in
    /// memory: the file reads as empty at once, other readers keep the
    /// stored bytes until the write-out, which deletes the cut chunks in
    /// the bulk that writes the new ones.
    #[test]
    fn a_truncate_of_an_open_file_goes_out_with_the_next_write_out() {
        let (_d, g, cs) = gated();
        let size = 2 * CHUNK + 7;
        cs.opening("1", 0, None, None);
        cs.write("1", 0, &vec![7u8; size as usize]).unwrap();
        cs.flush("1").unwrap();
        assert!(!cs.truncate_open("2", 0).unwrap(), "not open here");
        assert!(!cs.truncate_open("1", 5).unwrap(), "only to nothing");
        assert!(cs.truncate_open("1", 0).unwrap());
        let mut b = vec![1u8; 4];
        assert_eq!(cs.read("1", 0, &mut b).unwrap(), 0, "empty here at once");
        assert_eq!(stored(&g, "1", 3), [7u8; 3], "stored until the write-out");
        cs.write("1", 0, b"x\n").unwrap();
        cs.flush("1").unwrap();
        assert_eq!(stored(&g, "1", 3), *b"x\n\0");
        assert_eq!(
            cs.stored_chunks("1", 0).unwrap().len(),
            1,
            "chunks 1, 2 gone"
        );
        assert_eq!(cs.stored_bytes("1", None).unwrap(), Some(2));
        // Cut and nothing written after: the write-out is the deletes alone.
        assert!(cs.truncate_open("1", 0).unwrap());
        cs.sync("1").unwrap();
        assert!(cs.keys().unwrap().is_empty());
        // A removal meanwhile deletes what the cut had not yet.
        cs.write("1", 0, &vec![7u8; size as usize]).unwrap();
        cs.flush("1").unwrap();
        assert!(cs.truncate_open("1", 0).unwrap());
        let ops = cs.removal_ops("1", 0).expect("addressable");
        assert_eq!(ops.len(), 3);
    }

    /// A cut with nothing written after it rides in the bulk that persists
    /// the size: a close's flush leaves it, and one that did not land goes
    /// again.
    #[test]
    fn a_cut_alone_rides_with_the_size() {
        let (_d, g, cs) = gated();
        cs.opening("1", 0, None, None);
        cs.write("1", 0, &vec![7u8; CHUNK as usize + 1]).unwrap();
        cs.flush("1").unwrap();
        assert!(cs.truncate_open("1", 0).unwrap());
        cs.flush("1").unwrap();
        assert_eq!(cs.stored_chunks("1", 0).unwrap().len(), 2, "left to ride");
        let ops = cs.ride_with_size("1");
        assert_eq!(ops.len(), 2);
        cs.sent_with_size("1", false);
        let ops = cs.ride_with_size("1");
        assert_eq!(ops.len(), 2, "again after a failure");
        for r in g.bulk(ops).unwrap() {
            r.unwrap();
        }
        cs.sent_with_size("1", true);
        assert!(cs.ride_with_size("1").is_empty());
        assert!(cs.keys().unwrap().is_empty());
    }

    #[test]
    fn removing_by_size_deletes_every_chunk_and_buffered_bytes() {
        let (_d, cs) = store();
        let size = 3 * CHUNK + 7;
        cs.write("5", 0, &vec![7u8; size as usize]).unwrap();
        cs.flush("5").unwrap();
        cs.write("5", 2 * CHUNK, b"buffered").unwrap(); // not written out
        cs.write("6", 0, b"another file").unwrap();
        cs.flush("6").unwrap();
        cs.remove_sized("5", size).unwrap();
        assert!(cs.stored_chunks("5", 0).unwrap().is_empty());
        let mut b = vec![1u8; 8];
        assert_eq!(cs.read("5", 2 * CHUNK, &mut b).unwrap(), 0);
        assert_eq!(cs.keys().unwrap(), ["6"]);
        // An empty file has nothing to delete; a huge sparse one is searched.
        cs.remove_sized("empty", 0).unwrap();
        cs.write("9", 5000 * CHUNK, b"far").unwrap();
        cs.flush("9").unwrap();
        cs.remove_sized("9", 5000 * CHUNK + 3).unwrap();
        assert_eq!(cs.keys().unwrap(), ["6"]);
    }

    /// The same deletes as bulk items for the caller's own bulk (the
    /// inode's deletion rides with them); buffered bytes go at once.
    #[test]
    fn removal_ops_delete_every_chunk_in_the_callers_bulk() {
        let (_d, cs) = store();
        let size = 2 * CHUNK + 1;
        cs.write("5", 0, &vec![7u8; size as usize]).unwrap();
        cs.flush("5").unwrap();
        cs.write("5", 0, b"buffered").unwrap();
        let ops = cs.removal_ops("5", size).expect("addressable");
        assert_eq!(ops.len(), 3);
        let mut b = vec![1u8; 8];
        assert_eq!(cs.read("5", 0, &mut b).unwrap(), 8);
        assert_eq!(b, [7u8; 8], "the stored bytes, not the dropped buffer");
        for r in cs.store.bulk(ops).unwrap() {
            r.unwrap();
        }
        assert!(cs.keys().unwrap().is_empty());
        assert!(
            cs.removal_ops("9", 5000 * CHUNK).is_none(),
            "searched instead"
        );
    }

    #[test]
    fn removing_a_file_of_many_chunks_pages_through_them() {
        let (_d, cs) = store();
        // 2100 small chunks (sparse): more than two pages of chunk ids.
        for n in 0..2100 {
            cs.write("9", n * CHUNK, b"x").unwrap();
            if n % 8 == 0 {
                cs.flush("9").unwrap();
            }
        }
        cs.write("10", 0, b"y").unwrap();
        cs.flush("9").unwrap();
        cs.flush("10").unwrap();
        assert_eq!(cs.stored_chunks("9", 0).unwrap().len(), 2100);
        assert_eq!(cs.stored_chunks("9", 1500).unwrap().len(), 600);
        assert_eq!(cs.keys().unwrap(), ["10", "9"]);
        cs.remove("9").unwrap();
        assert!(cs.stored_chunks("9", 0).unwrap().is_empty());
        assert_eq!(cs.keys().unwrap(), ["10"]);
    }

    #[test]
    fn unflushed_writes_are_visible_to_reads() {
        let (_d, cs) = store();
        cs.write("1", 0, b"hello").unwrap();
        let mut b = [0u8; 5];
        cs.read("1", 0, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        assert!(cs.keys().unwrap().is_empty(), "nothing stored before flush");
        cs.flush("1").unwrap();
        assert_eq!(cs.keys().unwrap(), vec!["1".to_string()]);
    }

    const V1: Version = Version {
        seq_no: 1,
        primary_term: 1,
    };
    const V2: Version = Version {
        seq_no: 2,
        primary_term: 1,
    };

    /// Another mount's reader: a chunk store of its own over the store.
    /// The chunk is deleted behind it after the offer, so a read that
    /// fetches finds nothing: the bytes it returns came from the offer.
    fn offered(size: u64, open_as: Version, mark_moves: bool) -> (usize, Vec<u8>) {
        let (_d, g, writer) = gated();
        writer.write("1", 0, b"hello").unwrap();
        writer.flush("1").unwrap();
        let reader = ChunkStore::new(g.clone());
        let piece = reader.first_piece("1").expect("nothing held: named");
        let doc = g.get(piece.index, &piece.id).unwrap();
        if mark_moves {
            // This mount wrote the file meanwhile.
            reader.write("1", 0, b"HELLO").unwrap();
            reader.flush("1").unwrap();
        }
        reader.offer("1", piece, doc.as_ref(), size, V1);
        g.delete(Idx::Chunks, &chunk_id("1", 0), None).unwrap();
        reader.opening("1", size, Some(open_as), None);
        let mut b = vec![0u8; 5];
        let n = reader.read("1", 0, &mut b).unwrap();
        (n, b)
    }

    #[test]
    fn an_offered_piece_serves_an_open_of_the_inode_version_read_with_it() {
        assert_eq!(offered(5, V1, false), (5, b"hello".to_vec()));
    }

    #[test]
    fn an_offered_piece_is_not_used_for_another_version_or_size_or_after_a_change() {
        // Another inode version opened: the piece may not be its bytes.
        assert_eq!(offered(5, V2, false).0, 0);
        // The inode says 6 bytes, the piece holds 5: read across a write-out.
        assert_eq!(offered(6, V1, false).0, 0);
        // This mount wrote the file after naming the piece: its bytes win.
        assert_eq!(offered(5, V1, true), (5, b"HELLO".to_vec()));
    }

    /// What is kept for the indexer stays within its byte bound, counted
    /// exactly, and its eviction queue does not grow with files consumed.
    #[test]
    fn chunks_kept_for_the_indexer_stay_within_their_bounds() {
        let mut st = State::default();
        for i in 0..3000 {
            st.keep_written(&i.to_string(), 0, Arc::new(vec![0u8; 8192]));
            if i % 2 == 0 {
                assert!(st.take_written(&i.to_string(), 0).is_some());
            }
        }
        let held: usize = st
            .written
            .values()
            .flat_map(|c| c.values())
            .map(kept_weight)
            .sum();
        assert_eq!(st.written_bytes, held);
        assert!(held <= WRITTEN_BYTES && held > WRITTEN_BYTES / 2, "{held}");
        assert!(st.written_order.len() <= 2 * st.written.len() + 65);
    }

    #[test]
    fn the_indexer_reads_what_a_close_wrote_out_without_fetching_it() {
        let (_d, g, cs) = gated();
        cs.write("1", 0, b"some text").unwrap();
        cs.flush("1").unwrap();
        cs.release("1");
        g.delete(Idx::Chunks, &chunk_id("1", 0), None).unwrap();
        let mut b = vec![0u8; 9];
        assert_eq!(cs.read_written("1", 0, &mut b).unwrap(), 9);
        assert_eq!(&b, b"some text");
        // Read once: what is kept is given up, the next read fetches.
        let mut b = vec![0u8; 9];
        assert_eq!(cs.read_written("1", 0, &mut b).unwrap(), 0);
        // A truncate drops what was kept.
        cs.write("2", 0, b"abc").unwrap();
        cs.flush("2").unwrap();
        cs.truncate("2", 1).unwrap();
        let mut b = vec![0u8; 3];
        assert_eq!(cs.read_written("2", 0, &mut b).unwrap(), 1);
        assert_eq!(&b, b"a\0\0");
    }

    /// A file another mount wrote: the indexer is told which document to
    /// read with its batch, and what it offers serves `read_written` with
    /// no fetch, unless this mount wrote the file out since.
    #[test]
    fn what_the_indexer_read_along_serves_its_read() {
        let (_d, g, cs) = gated();
        let other = ChunkStore::new(g.clone());
        other.write("1", 0, b"from afar").unwrap();
        other.flush("1").unwrap();
        assert!(cs.written_piece("1", 100_000_000).is_none(), "a large file");
        let piece = cs.written_piece("1", 9).expect("a piece to read along");
        let doc = g.get(piece.index, &piece.id).unwrap();
        // Read along: gone from the store, still served.
        g.delete(Idx::Chunks, &chunk_id("1", 0), None).unwrap();
        cs.offer_written("1", piece.clone(), doc.as_ref(), 9);
        assert!(cs.written_piece("1", 9).is_none(), "held now");
        let mut b = vec![0u8; 9];
        assert_eq!(cs.read_written("1", 0, &mut b).unwrap(), 9);
        assert_eq!(&b, b"from afar");
        // Not the size the inode says: not kept.
        cs.offer_written("1", piece, doc.as_ref(), 5);
        assert_eq!(cs.read_written("1", 0, &mut [0u8; 9]).unwrap(), 0);
        // Named before this mount wrote the file out: the offer is stale.
        other.write("2", 0, b"old").unwrap();
        other.flush("2").unwrap();
        let piece = cs.written_piece("2", 3).unwrap();
        let doc = g.get(piece.index, &piece.id).unwrap();
        cs.write("2", 0, b"new").unwrap();
        cs.flush("2").unwrap();
        cs.release("2");
        let _ = cs.read_written("2", 0, &mut [0u8; 3]); // the write-out's own copy
        cs.offer_written("2", piece, doc.as_ref(), 3);
        let mut b = vec![0u8; 3];
        cs.read_written("2", 0, &mut b).unwrap();
        assert_eq!(&b, b"new");
    }
}
