//! Content indexing: a background thread that puts the text of regular files
//! into the `texts` index (one document per inode) and says so in their
//! entry documents (`text_state`), off the write path. The text is kept
//! apart from the entries so that what rewrites entries (a directory
//! rename's subtree, the attribute copies of every close) does not make the
//! engine analyse the text again: on Elasticsearch a partial update
//! re-indexes the whole document.
//!
//! The filesystem queues an inode when its contents may have changed: the
//! last close or a flush after writes (`persist`), fsync, and a truncate or
//! mtime change (setattr). The same events already rewrite the entry
//! documents' size/mtime, and `Entry::refresh_attrs` drops any indexed text
//! whose mtime differs from the inode's, so between a close and the
//! indexer's pass an entry is "not indexed" (searched by scanning the file),
//! never stale. The indexer reads the file from the data store, decides
//! text / binary / too_large, writes the text, makes it searchable, then
//! writes every name (link) of the inode with write-if-version, retrying
//! (text included) when something else (an attribute refresh, a rename)
//! wrote the document meanwhile.
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
/// Inodes taken from the queue at once, and the text per bulk of them:
/// each bulk of texts is made searchable (a refresh) before the entries
/// that point at it are written, a cost per bulk, so bulks are as large as
/// their text allows (100k one-line files on three nodes: indexing in
/// bulks of 64 fell minutes behind the writers).
const BATCH: usize = 1024;
const BULK_TEXT_BYTES: u64 = 8 << 20;
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
    /// Inodes of the batch being indexed (its writes under way; 0: none):
    /// still pending for a search, though no longer in `queue`.
    batch: usize,
    /// When the last change was queued, and since when the queue has held
    /// changes not yet picked up.
    last_change: Option<Instant>,
    pending_since: Option<Instant>,
    /// While the mount is busy, no batch before this (see `PACE`).
    paced_until: Option<Instant>,
    /// Batches failed in a row.
    failures: u32,
    /// Directory renames under way (their subtrees' entries rewritten):
    /// no batch starts until they are done, whatever its deadline. Both
    /// write the same entries (each conflict is redone) and share the
    /// engine, and someone waits for the `mv` (on three nodes, 100 000
    /// files: 7.0-7.4 s against 7.7-8.2 s, docs/cluster.md).
    rewrites: usize,
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

    /// A directory rename's path step started (`on`) or ended: while one
    /// runs no batch starts (see `State::rewrites`).
    pub(crate) fn rewriting(&self, on: bool) {
        let mut st = self.inner.state.lock();
        if on {
            st.rewrites += 1;
        } else {
            st.rewrites = st.rewrites.saturating_sub(1);
            self.inner.work.notify_one();
        }
    }

    /// Inodes queued (changes and backfill) or being indexed.
    pub(crate) fn queued(&self) -> usize {
        let st = self.inner.state.lock();
        st.queue.len() + st.batch
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
        while st.batch > 0 {
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
                    if st.rewrites > 0 {
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
                let n = st.queue.len().min(BATCH);
                st.batch = n;
                let inos: Vec<u64> = st.queue.drain(..n).collect();
                for ino in &inos {
                    st.queued.remove(ino);
                }
                inos
            };
            let started = Instant::now();
            let failed = self.index_batch(&batch).err();
            let mut st = self.state.lock();
            st.batch = 0;
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

    /// Queue every file entry not indexed yet (no `text_state` field: also
    /// every entry of a filesystem made while the text was in the entries,
    /// before the `texts` index).
    fn backfill(&self) -> Result<(), StoreError> {
        let q = Query::Bool {
            must: vec![Query::term("kind", "file")],
            must_not: vec![Query::Exists {
                field: "text_state".into(),
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

    /// Index a batch of inodes: one bulk of their texts, made searchable,
    /// then one of their entries pointing at them. Inodes whose entries
    /// changed meanwhile (a close's attribute copy, a directory rename's
    /// path step) are read and written again together, in rounds: one by
    /// one, a rename of the tree a batch was in cost a read, two bulks and
    /// a refresh per file.
    fn index_batch(&self, inos: &[u64]) -> FsResult<()> {
        let mut todo = inos.to_vec();
        for round in 0.. {
            todo = self.index_round(&todo)?;
            if todo.is_empty() {
                break;
            }
            if round >= MAX_RETRIES {
                log::warn!(
                    "content index: {} inodes given up after {round} conflicts",
                    todo.len()
                );
                break;
            }
        }
        Ok(())
    }

    /// One round of [`Inner::index_batch`]; returns the inodes whose
    /// entries changed between their read and their write.
    fn index_round(&self, inos: &[u64]) -> FsResult<Vec<u64>> {
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
        let mut keys: Vec<(Idx, String)> = files
            .iter()
            .flat_map(|i| i.links.iter().map(|l| (Idx::Entries, link_entry_id(l))))
            .collect();
        // Small files' contents the data store would fetch one by one (a
        // backlog past what it keeps of the closes' write-outs) in the same
        // request as the names.
        let names_end = keys.len();
        let pieces: Vec<(&str, u64, crate::data::Piece)> = files
            .iter()
            .filter_map(|i| {
                let key = i.content.as_deref().filter(|_| i.size <= self.max_bytes)?;
                let piece = self.data.written_piece(key, i.size)?;
                keys.push((piece.index, piece.id.clone()));
                Some((key, i.size, piece))
            })
            .collect();
        let mut docs = self.store.mget_docs(&keys, true)?;
        for ((key, size, piece), doc) in pieces.into_iter().zip(&docs[names_end..]) {
            self.data.offer_written(key, piece, doc.as_ref(), size);
        }
        docs.truncate(names_end);
        let mut names = docs.into_iter();
        let mut retry = Vec::new();
        let mut bulk = Vec::new();
        let mut bytes = 0;
        for inode in &files {
            let docs: Vec<Option<Doc>> = names.by_ref().take(inode.links.len()).collect();
            match self.ops_for(inode, docs) {
                Ok(Some(ops)) => bulk.push(ops),
                Ok(None) => {}
                Err(e) => log::warn!("content index: inode {}: {e}", inode.ino),
            }
            bytes += inode.size.min(self.max_bytes);
            if bytes >= BULK_TEXT_BYTES {
                retry.extend(self.write(std::mem::take(&mut bulk))?);
                bytes = 0;
            }
        }
        retry.extend(self.write(bulk)?);
        retry.sort_unstable();
        retry.dedup();
        Ok(retry)
    }

    /// Write `batch`: the texts, made searchable everywhere, then the
    /// entries that send a search to them (an entry saying "text" is never
    /// searchable before its text; `esfs search` reads both from its own
    /// process). Returns the inodes whose entries changed meanwhile.
    fn write(&self, batch: Vec<InodeOps>) -> FsResult<Vec<u64>> {
        if batch.is_empty() {
            return Ok(vec![]);
        }
        let (texts, rest): (Vec<BulkOp>, Vec<(u64, Vec<BulkOp>)>) = batch
            .into_iter()
            .map(|b| (b.text, (b.ino, b.claims)))
            .unzip();
        let mut claims = Vec::new();
        let mut claim_inos = Vec::new();
        for ((ino, ops), r) in rest.into_iter().zip(self.store.bulk(texts)?) {
            match r {
                Ok(_) | Err(StoreError::NotFound(_)) => {
                    claim_inos.extend(std::iter::repeat_n(ino, ops.len()));
                    claims.extend(ops);
                }
                Err(e) => log::warn!("content index: inode {ino}: {e}"),
            }
        }
        if claims.is_empty() {
            return Ok(vec![]);
        }
        self.store.expose(Idx::Texts)?;
        let mut retry = Vec::new();
        for (r, ino) in self.store.bulk(claims)?.into_iter().zip(claim_inos) {
            match r {
                Ok(_) => {}
                Err(StoreError::Conflict(_)) => retry.push(ino),
                Err(e) => log::warn!("content index: inode {ino}: {e}"),
            }
        }
        Ok(retry)
    }

    /// What indexing `inode` writes, its names' documents (brief) read: its
    /// text (or the removal of a text it no longer has), and the conditional
    /// writes of each entry's text state. None when no name is left.
    fn ops_for(&self, inode: &Inode, docs: Vec<Option<Doc>>) -> FsResult<Option<InodeOps>> {
        let ino = inode.ino;
        // Its names as read (their versions make the claims conditional);
        // none left: nothing to read the file for.
        let mut names = Vec::new();
        for (link, edoc) in inode.links.iter().zip(docs) {
            let Some(edoc) = edoc else {
                continue;
            };
            let entry: Entry = edoc.parse()?;
            if entry.ino == ino {
                names.push((link_entry_id(link), entry, edoc.version));
            }
        }
        if names.is_empty() {
            return Ok(None);
        }
        let (text, state) = match self.text_of(inode)? {
            Text::Utf8(contents) => {
                let doc = FileText {
                    ino,
                    contents,
                    mtime_ns: inode.mtime_ns,
                };
                let op = BulkOp::Index {
                    index: Idx::Texts,
                    id: text_id(ino),
                    source: serde_json::to_value(&doc)?,
                    if_version: None,
                };
                (op, INDEXED_TEXT)
            }
            Text::Binary => (delete_text(ino), INDEXED_BINARY),
            Text::TooLarge => (delete_text(ino), INDEXED_TOO_LARGE),
        };
        let mut claims = Vec::new();
        for (id, mut entry, version) in names {
            entry.refresh_attrs(inode);
            entry.text_state = Some(state.to_string());
            entry.text_mtime_ns = Some(inode.mtime_ns);
            claims.push(BulkOp::Index {
                index: Idx::Entries,
                id,
                source: serde_json::to_value(&entry)?,
                if_version: Some(version),
            });
        }
        Ok(Some(InodeOps { ino, text, claims }))
    }
}

/// What indexing one inode writes: its document in `texts` (or its
/// removal), then its entries' text state, each conditional on the entry
/// as read.
struct InodeOps {
    ino: u64,
    text: BulkOp,
    claims: Vec<BulkOp>,
}

/// The removal of an inode's text (a file that became binary or too large;
/// gone already is as good).
fn delete_text(ino: u64) -> BulkOp {
    BulkOp::Delete {
        index: Idx::Texts,
        id: text_id(ino),
        if_version: None,
    }
}

/// The id of the entry document a back-link names.
fn link_entry_id(l: &Link) -> String {
    entry_id(l.p, &decode_bytes(&l.n))
}
