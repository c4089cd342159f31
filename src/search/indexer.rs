//! Content indexing: a background thread that puts the text of regular files
//! into their entry documents (`contents`, `indexed`), off the write path.
//!
//! The filesystem queues an inode when its contents may have changed: the
//! last close or a flush after writes (`persist`), fsync, and a truncate or
//! mtime change (setattr). The same events already rewrite the entry
//! documents' size/mtime, and `Entry::refresh_attrs` drops any indexed text
//! whose mtime differs from the inode's, so between a close and the
//! indexer's pass an entry is "not indexed" (searched by scanning the file),
//! never stale. The indexer reads the file from the data store, decides
//! text / binary / too_large, and writes every name (link) of the inode with
//! write-if-version, retrying when something else (an attribute refresh, a
//! rename) wrote the document meanwhile.
//!
//! Indexing waits for a quiet second after the last change (see `QUIET`),
//! so bulk writes (`tar x`, `cp -r`) run at full speed and files deleted
//! soon after being written (build outputs, temporary files) are never
//! indexed; until then search scans those files, as above. A change
//! waits at most `MAX_DELAY`; past it, while the mount stays busy, the
//! indexer is paced to a quarter of the time (`PACE`).
//!
//! Search never waits for the indexer: a file not indexed yet is scanned, so
//! a search right after a `cp -a` of thousands of files answers as fast as
//! `grep -r` and narrows more as the indexer catches up. At start the thread
//! also queues every file entry that has no `indexed` field (a store from
//! before content indexing, or changes a dead mount never indexed).

use crate::data::DataStore;
use crate::error::FsResult;
use crate::model::*;
use crate::store::{BulkOp, Doc, Idx, MetaStore, Query, Sort, StoreError};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Files larger than this are `too_large` unless `ESFS_INDEX_MAX_BYTES` says otherwise.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 1 << 20;
/// Inodes indexed per store bulk.
const BATCH: usize = 64;
/// Changes are indexed once the mount has had no new ones for this long
/// (a `tar x` or `cp -r` is not slowed by indexing each file as it lands,
/// and files deleted meanwhile are never indexed), or when the oldest has
/// waited `MAX_DELAY`. A search does not hurry it: it scans what is queued.
const QUIET: Duration = Duration::from_millis(1000);
const MAX_DELAY: Duration = Duration::from_secs(10);
/// Past `MAX_DELAY` while the mount stays busy, a batch is followed by this
/// many times its own duration without indexing: the indexer then takes at
/// most a quarter of the engine's time from the work it shares it with (on
/// a machine shared with the engine, its cores too). Once the mount is
/// quiet it catches up at full speed.
const PACE: u32 = 3;
/// Failed batches retried in a row before one is given up.
const MAX_BATCH_FAILURES: u32 = 5;
const MAX_RETRIES: usize = 50;

pub(crate) struct Indexer {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn MetaStore>,
    data: Arc<dyn DataStore>,
    max_bytes: u64,
    state: Mutex<State>,
    /// Work was queued (or stop was asked).
    work: Condvar,
    /// A batch finished (`stop` waits for the one under way).
    progress: Condvar,
    /// Milliseconds from `epoch` to the last namespace change (see
    /// `Indexer::activity`).
    epoch: Instant,
    activity_ms: AtomicU64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<u64>,
    /// The inodes in `queue` (each is queued once).
    queued: HashSet<u64>,
    stop: bool,
    /// A batch is being indexed (its writes are under way).
    busy: bool,
    /// When the last change was queued, and since when the queue has held
    /// changes not yet picked up.
    last_change: Option<Instant>,
    pending_since: Option<Instant>,
    /// While the mount is busy, no batch before this (see `PACE`).
    paced_until: Option<Instant>,
    /// Batches failed in a row.
    failures: u32,
}

/// What the indexer decided for one inode.
enum Text {
    Utf8(String),
    Binary,
    TooLarge,
}

impl Indexer {
    /// Start the indexing thread. `max_bytes` 0 indexes no text (every file
    /// is then `too_large`, i.e. always scanned).
    pub(crate) fn start(
        store: Arc<dyn MetaStore>,
        data: Arc<dyn DataStore>,
        max_bytes: u64,
    ) -> Indexer {
        let inner = Arc::new(Inner {
            store: crate::store::for_caller(&store, crate::store::Caller::Indexer),
            data,
            max_bytes,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            progress: Condvar::new(),
            epoch: Instant::now(),
            activity_ms: AtomicU64::new(0),
        });
        let i = inner.clone();
        std::thread::Builder::new()
            .name("esfs-indexer".into())
            .spawn(move || i.run())
            .expect("spawn indexer thread");
        Indexer { inner }
    }

    /// Queue `ino` (its contents may have changed).
    pub(crate) fn enqueue(&self, ino: u64) {
        let mut st = self.inner.state.lock();
        // Queued and not started yet: that pass will see this change.
        if st.queued.insert(ino) {
            st.queue.push_back(ino);
        }
        let now = Instant::now();
        st.last_change = Some(now);
        st.pending_since.get_or_insert(now);
        self.inner.work.notify_one();
    }

    /// The namespace changed (a name made, removed or renamed), or a
    /// directory was listed (a walk: `find`, `rsync`, `du`): the mount is
    /// busy, so indexing waits for quiet as after a content change. An `rm
    /// -rf` right after a `tar x` was 3x slower while the indexer competed
    /// with it for the store and the CPU (and indexed files about to go);
    /// an `rsync` that copies nothing right after one that copied a tree
    /// took 1.09x JuiceFS's time while the node indexed the copy's text.
    /// (Scattered lookups and `stat`s do not count: a poll of a few files
    /// would hold indexing off until `MAX_DELAY`.) Lock-free: every
    /// namespace change and listing calls it.
    pub(crate) fn activity(&self) {
        let ms = self.inner.epoch.elapsed().as_millis() as u64;
        self.inner.activity_ms.store(ms, Ordering::Relaxed);
    }

    /// Inodes queued (changes and backfill).
    pub(crate) fn queued(&self) -> usize {
        self.inner.state.lock().queue.len()
    }
}

impl Indexer {
    /// Stop indexing and wait for a batch in progress to finish: at
    /// unmount, the final commit must follow the indexer's last write.
    /// What is still queued is indexed by the next mount (its backfill).
    pub(crate) fn stop(&self) {
        let mut st = self.inner.state.lock();
        st.stop = true;
        self.inner.work.notify_all();
        while st.busy {
            self.inner.progress.wait(&mut st);
        }
    }
}

impl Drop for Indexer {
    fn drop(&mut self) {
        self.inner.state.lock().stop = true;
        self.inner.work.notify_all();
    }
}

impl Inner {
    fn run(&self) {
        if let Err(e) = self.backfill() {
            log::warn!("content index: backfill query failed: {e}");
        }
        loop {
            // Whether this batch runs while the mount is busy (past the
            // deadline, not in a quiet moment): then the next one waits.
            let paced;
            let batch: Vec<u64> = {
                let mut st = self.state.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    if st.queue.is_empty() {
                        st.pending_since = None;
                        self.work.wait(&mut st);
                        continue;
                    }
                    // Wait for a quiet moment (or the oldest change's deadline).
                    let now = Instant::now();
                    let active = self.epoch
                        + Duration::from_millis(self.activity_ms.load(Ordering::Relaxed));
                    let quiet_at = st.last_change.map_or(now, |t| t.max(active) + QUIET);
                    let due_at = st.pending_since.map_or(now, |t| t + MAX_DELAY);
                    let due_at = st.paced_until.map_or(due_at, |t| t.max(due_at));
                    let at = quiet_at.min(due_at);
                    if at <= now {
                        paced = quiet_at > now;
                        break;
                    }
                    self.work.wait_until(&mut st, at);
                }
                st.busy = true;
                let n = st.queue.len().min(BATCH);
                let inos: Vec<u64> = st.queue.drain(..n).collect();
                for ino in &inos {
                    st.queued.remove(ino);
                }
                inos
            };
            let started = Instant::now();
            let failed = self.index_batch(&batch).err();
            let mut st = self.state.lock();
            st.busy = false;
            st.paced_until = paced.then(|| Instant::now() + started.elapsed() * PACE);
            if st.stop {
                drop(st);
                self.progress.notify_all();
                return;
            }
            if let Some(e) = failed {
                // A store or data error (overload, a transient outage): try
                // the batch again later, a few times, before giving up on it
                // (search then keeps scanning those files).
                st.failures += 1;
                if st.failures <= MAX_BATCH_FAILURES {
                    log::warn!("content index: {e}; retrying");
                    for ino in batch {
                        // Queued again meanwhile: that pass covers this one.
                        if st.queued.insert(ino) {
                            st.queue.push_back(ino);
                        }
                    }
                    st.last_change = Some(Instant::now());
                    drop(st);
                    continue;
                }
                log::warn!("content index: {e}");
            }
            st.failures = 0;
        }
    }

    /// Queue every file entry not indexed yet (no `indexed` field).
    fn backfill(&self) -> Result<(), StoreError> {
        let q = Query::Bool {
            must: vec![Query::term("kind", "file")],
            must_not: vec![Query::Exists {
                field: "indexed".into(),
            }],
            should: vec![],
        };
        let mut inos = Vec::new();
        crate::store::search_after_pages(
            &*self.store,
            Idx::Entries,
            &q,
            &[Sort::asc("path"), Sort::asc("cookie")],
            1000,
            &mut |hits| {
                for h in hits {
                    if let Some(ino) = h.doc.source["ino"].as_u64() {
                        inos.push(ino);
                    }
                }
                Ok(true)
            },
        )?;
        if inos.is_empty() {
            return Ok(());
        }
        log::info!(
            "content index: indexing {} files not indexed yet",
            inos.len()
        );
        let mut st = self.state.lock();
        for ino in inos {
            if st.queued.insert(ino) {
                st.queue.push_back(ino);
            }
        }
        Ok(())
    }

    /// The text of an inode's contents, as the index keeps it.
    fn text_of(&self, inode: &Inode) -> std::io::Result<Text> {
        if inode.size > self.max_bytes {
            return Ok(Text::TooLarge);
        }
        let Some(key) = &inode.content else {
            return Ok(Text::Utf8(String::new()));
        };
        let mut buf = vec![0u8; inode.size as usize];
        // Bytes past what the store holds are a hole: zeros, i.e. binary.
        // What the close wrote out, when it was this mount's: no re-read.
        let n = self.data.read_written(key, 0, &mut buf)?;
        if n < buf.len() || buf.contains(&0) {
            return Ok(Text::Binary);
        }
        match String::from_utf8(buf) {
            Ok(s) => Ok(Text::Utf8(s)),
            Err(_) => Ok(Text::Binary),
        }
    }

    /// Index a batch of inodes: one bulk for the entry documents, then
    /// inodes whose documents changed meanwhile redone one at a time.
    fn index_batch(&self, inos: &[u64]) -> FsResult<()> {
        let mut retry: Vec<u64> = Vec::new();
        let mut ops = Vec::new();
        let mut op_inos = Vec::new();
        // The batch's inodes in one read, then all their names in another
        // (copies the cache still trusts are not read again): the indexer
        // runs a quiet second after the writes, when on Elasticsearch the
        // copies the closes left have expired.
        let ids: Vec<String> = inos.iter().map(|i| inode_id(*i)).collect();
        let mut files = Vec::new();
        for (ino, doc) in inos.iter().zip(self.store.mget(Idx::Inodes, &ids)?) {
            match doc.map(|d| d.parse::<Inode>()) {
                Some(Ok(i)) if i.kind == Kind::File && !i.links.is_empty() => files.push(i),
                Some(Err(e)) => log::warn!("content index: inode {ino}: {e}"),
                _ => {}
            }
        }
        let keys: Vec<(Idx, String)> = files
            .iter()
            .flat_map(|i| i.links.iter().map(|l| (Idx::Entries, link_entry_id(l))))
            .collect();
        // Brief: the text fields are exactly what this write replaces.
        let mut names = self.store.mget_docs(&keys, true)?.into_iter();
        for inode in &files {
            let docs: Vec<Option<Doc>> = names.by_ref().take(inode.links.len()).collect();
            match self.ops_for(inode, docs) {
                Ok(v) => {
                    for op in v {
                        ops.push(op);
                        op_inos.push(inode.ino);
                    }
                }
                Err(e) => log::warn!("content index: inode {}: {e}", inode.ino),
            }
        }
        if !ops.is_empty() {
            let results = self.store.bulk(ops)?;
            for (r, ino) in results.into_iter().zip(op_inos) {
                match r {
                    Ok(_) => {}
                    Err(StoreError::Conflict(_)) => retry.push(ino),
                    Err(e) => log::warn!("content index: inode {ino}: {e}"),
                }
            }
        }
        retry.dedup();
        for ino in retry {
            for attempt in 0.. {
                let ops = match self.entry_ops(ino) {
                    Ok(ops) => ops,
                    Err(e) => {
                        log::warn!("content index: inode {ino}: {e}");
                        break;
                    }
                };
                let results = self.store.bulk(ops)?;
                if results
                    .iter()
                    .all(|r| !matches!(r, Err(StoreError::Conflict(_))))
                {
                    break;
                }
                if attempt >= MAX_RETRIES {
                    log::warn!("content index: inode {ino}: gave up after {attempt} conflicts");
                    break;
                }
            }
        }
        Ok(())
    }

    /// The conditional writes that put the inode's text into each of its
    /// entry documents (none when it is gone or not a regular file).
    fn entry_ops(&self, ino: u64) -> FsResult<Vec<BulkOp>> {
        let Some(doc) = self.store.get(Idx::Inodes, &inode_id(ino))? else {
            return Ok(vec![]);
        };
        let inode: Inode = doc.parse()?;
        if inode.kind != Kind::File || inode.links.is_empty() {
            return Ok(vec![]);
        }
        let docs = inode
            .links
            .iter()
            .map(|l| self.store.get_brief(Idx::Entries, &link_entry_id(l)))
            .collect::<Result<Vec<_>, _>>()?;
        self.ops_for(&inode, docs)
    }

    /// [`Indexer::entry_ops`] of `inode`, its names' documents (brief) read.
    fn ops_for(&self, inode: &Inode, docs: Vec<Option<Doc>>) -> FsResult<Vec<BulkOp>> {
        let ino = inode.ino;
        let text = self.text_of(inode)?;
        let (contents, indexed) = match text {
            Text::Utf8(s) => (Some(s), INDEXED_TEXT),
            Text::Binary => (None, INDEXED_BINARY),
            Text::TooLarge => (None, INDEXED_TOO_LARGE),
        };
        let mut ops = Vec::new();
        for (link, edoc) in inode.links.iter().zip(docs) {
            let id = link_entry_id(link);
            let Some(edoc) = edoc else {
                continue;
            };
            let mut entry: Entry = edoc.parse()?;
            if entry.ino != ino {
                continue;
            }
            entry.refresh_attrs(inode);
            entry.contents = contents.clone();
            entry.indexed = Some(indexed.to_string());
            entry.text_mtime_ns = Some(inode.mtime_ns);
            ops.push(BulkOp::Index {
                index: Idx::Entries,
                id,
                source: serde_json::to_value(&entry)?,
                if_version: Some(edoc.version),
            });
        }
        Ok(ops)
    }
}

/// The id of the entry document a back-link names.
fn link_entry_id(l: &Link) -> String {
    entry_id(l.p, &decode_bytes(&l.n))
}
