//! File contents as chunk documents in the metadata store's `chunks` index,
//! so one Elasticsearch cluster is the whole deployment and every mount sees
//! the same bytes. Written over [`MetaStore`], so it runs on any backend.
//!
//! A chunk is `CHUNK` bytes of one file (`_id` = `<key>:<n>`, source
//! `{"file", "n", "data": base64}`); a missing chunk is a hole. Writes are
//! buffered per file in memory and written in one bulk on flush (every
//! close), fsync, or when a file's buffer passes `MAX_DIRTY`; reads see the
//! buffer first, then a small cache of clean chunks, then the store.

use super::{Capacity, DataStore};
use crate::store::{BulkOp, Idx, MetaStore, Query, SearchRequest, Sort, StoreError};
use base64::Engine;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::sync::Arc;

/// 1 MiB: a bulk of a few chunks stays far below request limits, and a
/// sequential writer issues one store write per MiB.
pub const CHUNK: u64 = 1 << 20;
/// Dirty bytes per file before its buffer is written out early.
const MAX_DIRTY: usize = 16;
/// Clean chunks kept for reads.
const CACHE_CHUNKS: usize = 64;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Default)]
struct State {
    /// key -> chunk number -> contents (possibly shorter than CHUNK).
    dirty: HashMap<String, BTreeMap<u64, Vec<u8>>>,
    clean: HashMap<(String, u64), Arc<Vec<u8>>>,
    lru: VecDeque<(String, u64)>,
    /// Stored length of each dirty chunk before it turned dirty.
    was: HashMap<(String, u64), usize>,
    /// Bytes stored per key, counted as chunks are written and deleted
    /// (see `stored_bytes`): st_blocks without a search per stat.
    stored: HashMap<String, Stored>,
}

/// What this mount knows of a key's stored bytes.
enum Stored {
    /// Changed by this much since the figure in the inode document.
    Delta(i64),
    Exact(u64),
}

impl State {
    fn stored_changed(&mut self, key: &str, by: i64) {
        let e = self
            .stored
            .entry(key.to_string())
            .or_insert(Stored::Delta(0));
        *e = match *e {
            Stored::Delta(d) => Stored::Delta(d + by),
            Stored::Exact(b) => Stored::Exact((b as i64 + by).max(0) as u64),
        };
    }
}

pub struct ChunkStore {
    store: Arc<dyn MetaStore>,
    state: Mutex<State>,
}

fn chunk_id(key: &str, n: u64) -> String {
    format!("{key}:{n}")
}

fn io_err(e: StoreError) -> io::Error {
    io::Error::other(e)
}

impl ChunkStore {
    pub fn new(store: Arc<dyn MetaStore>) -> ChunkStore {
        ChunkStore {
            store,
            state: Mutex::new(State::default()),
        }
    }

    /// Current contents of chunk `n` (without the dirty buffer).
    fn load(&self, key: &str, n: u64) -> io::Result<Arc<Vec<u8>>> {
        if let Some(c) = self.state.lock().clean.get(&(key.to_string(), n)) {
            return Ok(c.clone());
        }
        let data = match self
            .store
            .get(Idx::Chunks, &chunk_id(key, n))
            .map_err(io_err)?
        {
            Some(doc) => B64
                .decode(doc.source["data"].as_str().unwrap_or_default())
                .map_err(|e| io::Error::other(format!("corrupt chunk {key}:{n}: {e}")))?,
            None => Vec::new(),
        };
        let data = Arc::new(data);
        let mut st = self.state.lock();
        st.clean.insert((key.to_string(), n), data.clone());
        st.lru.push_back((key.to_string(), n));
        while st.lru.len() > CACHE_CHUNKS {
            if let Some(old) = st.lru.pop_front() {
                st.clean.remove(&old);
            }
        }
        Ok(data)
    }

    fn forget_clean(&self, key: &str) {
        let mut st = self.state.lock();
        st.clean.retain(|(k, _), _| k != key);
        st.lru.retain(|(k, _)| k != key);
    }

    /// Write the dirty chunks of `key` in one bulk.
    fn write_out(&self, key: &str) -> io::Result<()> {
        let Some(chunks) = self.state.lock().dirty.remove(key) else {
            return Ok(());
        };
        let ops: Vec<BulkOp> = chunks
            .iter()
            .map(|(n, data)| BulkOp::Index {
                index: Idx::Chunks,
                id: chunk_id(key, *n),
                // `len`: what a truncate deleting the chunk subtracts.
                source: json!({"file": key, "n": n, "len": data.len(), "data": B64.encode(data)}),
                if_version: None,
            })
            .collect();
        let results = self.store.bulk(ops);
        let failed = match results {
            Ok(rs) => rs.into_iter().find_map(|r| r.err()),
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            // Keep the data buffered so a later flush can retry.
            let mut st = self.state.lock();
            let d = st.dirty.entry(key.to_string()).or_default();
            for (n, data) in chunks {
                d.entry(n).or_insert(data);
            }
            return Err(io_err(e));
        }
        let mut st = self.state.lock();
        for (n, data) in chunks {
            let k = (key.to_string(), n);
            let was = st.was.remove(&k).unwrap_or(0);
            st.stored_changed(key, data.len() as i64 - was as i64);
            if st.clean.contains_key(&k) {
                st.clean.insert(k, Arc::new(data));
            }
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
}

impl DataStore for ChunkStore {
    fn read(&self, key: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0usize;
        let mut held = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let (n, within) = (pos / CHUNK, (pos % CHUNK) as usize);
            let want = (buf.len() - done).min(CHUNK as usize - within);
            let dirty = self
                .state
                .lock()
                .dirty
                .get(key)
                .and_then(|d| d.get(&n).cloned());
            let data = match dirty {
                Some(d) => Arc::new(d),
                None => self.load(key, n)?,
            };
            if within < data.len() {
                let k = want.min(data.len() - within);
                buf[done..done + k].copy_from_slice(&data[within..within + k]);
                held = done + k;
            }
            // Past a chunk's end is a hole: the caller's buffer stays zero.
            done += want;
        }
        Ok(held)
    }

    fn write(&self, key: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let pos = off + done as u64;
            let (n, within) = (pos / CHUNK, (pos % CHUNK) as usize);
            let k = (data.len() - done).min(CHUNK as usize - within);
            let has = self
                .state
                .lock()
                .dirty
                .get(key)
                .is_some_and(|d| d.contains_key(&n));
            let base = if has { None } else { Some(self.load(key, n)?) };
            let mut st = self.state.lock();
            let State { dirty, was, .. } = &mut *st;
            let chunk = dirty
                .entry(key.to_string())
                .or_default()
                .entry(n)
                .or_insert_with(|| {
                    let b = base.map(|b| (*b).clone()).unwrap_or_default();
                    was.insert((key.to_string(), n), b.len());
                    b
                });
            if chunk.len() < within + k {
                chunk.resize(within + k, 0);
            }
            chunk[within..within + k].copy_from_slice(&data[done..done + k]);
            done += k;
        }
        let over = self
            .state
            .lock()
            .dirty
            .get(key)
            .is_some_and(|d| d.len() > MAX_DIRTY);
        if over {
            self.write_out(key)?;
        }
        Ok(())
    }

    fn flush(&self, key: &str) -> io::Result<()> {
        self.write_out(key)
    }

    fn truncate(&self, key: &str, size: u64) -> io::Result<()> {
        self.write_out(key)?;
        self.forget_clean(key);
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
            for r in self.store.bulk(ops).map_err(io_err)? {
                match r {
                    Ok(_) | Err(StoreError::NotFound(_)) => {}
                    Err(e) => return Err(io_err(e)),
                }
            }
            self.state.lock().stored_changed(key, -(freed as i64));
        }
        // Cut the last kept chunk so bytes past `size` read as zeros if the
        // file grows again.
        if !size.is_multiple_of(CHUNK) {
            let n = size / CHUNK;
            let data = self.load(key, n)?;
            let cut = (size % CHUNK) as usize;
            if data.len() > cut {
                let mut st = self.state.lock();
                st.was.insert((key.to_string(), n), data.len());
                st.dirty
                    .entry(key.to_string())
                    .or_default()
                    .insert(n, data[..cut].to_vec());
                drop(st);
                self.write_out(key)?;
                self.forget_clean(key);
            }
        }
        Ok(())
    }

    fn sync(&self, key: &str) -> io::Result<()> {
        self.write_out(key)?;
        self.store.sync().map_err(io_err)
    }

    fn remove(&self, key: &str) -> io::Result<()> {
        {
            let mut st = self.state.lock();
            st.dirty.remove(key);
            st.was.retain(|(k, _), _| k != key);
        }
        self.truncate(key, 0)?;
        self.state.lock().stored.remove(key);
        Ok(())
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
        // Written back with the inode (its release follows a persist).
        self.state.lock().stored.remove(key);
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
}
