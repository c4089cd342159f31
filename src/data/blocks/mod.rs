//! File contents as immutable blocks in S3-compatible object storage.
//!
//! A block is one object, `PREFIX/blocks/<file>/<block>`: `<file>` the
//! file's stable content key (never a path, so renames move nothing),
//! `<block>` a [`BlockId`] fresh for every upload, so an object is written
//! once and never changed. A file's contents are its [`BlockMap`], held in
//! its inode document: a write uploads new blocks ([`BlockStore::put`]),
//! then commits the new map with the document's version check; readers on
//! any mount read the blocks of the one map they loaded ([`BlockStore::read`]),
//! never a mix. Blocks a commit superseded are deleted after a grace period
//! (so a reader holding the old map keeps its version); blocks of an upload
//! that never committed are orphans, found by [`audit`].
//!
//! Object storage is reached through `object_store` (Apache Arrow's; see
//! docs/object-storage.md for why), which retries transport failures, 5xx
//! and throttling with backoff within the retry budget; past it an
//! operation fails with [`BlockError::Unavailable`] (ETIMEDOUT), as the
//! metadata store does. A local [`BlockCache`] serves re-reads.
//!
//! The API is synchronous (FUSE threads call it) over this store's own
//! tokio runtime, where uploads and downloads run in parallel, each bounded
//! by `concurrency` requests in flight.

pub mod cache;
pub mod config;
pub mod map;

pub use cache::{BlockCache, CacheUsage};
pub use config::{BlockConfig, S3Location, is_object_url};
pub use map::{Audit, BlockId, BlockMap, BlockMeta, Extent, Piece, audit};

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3;
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// A block store failure; `crate::error` maps each to its errno (the
/// io::Error a data store returns keeps the kind that decides it).
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// Unreachable, or failing with 5xx/throttling, for the whole retry
    /// budget: ETIMEDOUT ("try again later"), as for the metadata store.
    #[error("{0}")]
    Unavailable(String),
    /// A block a committed map refers to is not in the store: EIO.
    #[error("{0}")]
    Missing(String),
    /// A block shorter than its map says: EIO.
    #[error("{0}")]
    Corrupt(String),
    /// The store refused the credentials or the request: EIO (the file is
    /// not what is forbidden; the message says what is).
    #[error("{0}")]
    Denied(String),
    /// Bad configuration (URL, endpoint, missing bucket): EIO when met by
    /// a filesystem operation (it is meant to fail the mount instead).
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Io(String),
}

pub type BlockResult<T> = Result<T, BlockError>;

impl From<BlockError> for std::io::Error {
    fn from(e: BlockError) -> Self {
        let kind = match e {
            BlockError::Unavailable(_) => std::io::ErrorKind::TimedOut,
            BlockError::Config(_) => std::io::ErrorKind::InvalidInput,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e.to_string())
    }
}

/// What the async tasks share (uploads and prefetches outlive a call).
struct Inner {
    s3: AmazonS3,
    /// `PREFIX/blocks` (or `blocks`).
    root: String,
    /// "s3://BUCKET/PREFIX at ENDPOINT", for messages.
    shown: String,
    budget: Duration,
    cache: Option<BlockCache>,
    uploads: Semaphore,
    downloads: Semaphore,
    /// Whole-block fetches in progress, by cache name: a second reader of
    /// a block waits for the first's download instead of repeating it.
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Blocks on their way into the cache (written in the background, so
    /// readers go at the network's speed, not the cache disk's), served
    /// from memory meanwhile; at most `backlog` of them (beyond, a block
    /// is not cached).
    pending: Mutex<HashMap<String, Bytes>>,
    backlog: usize,
    /// Blocks of a sequential read of a file too big for the cache, held
    /// in memory only (at most `backlog`, the oldest dropped first): a
    /// scan of a file that big would only flush the cache, and writing
    /// blocks to the cache disk costs as much CPU as fetching them.
    streamed: Mutex<VecDeque<(String, Bytes)>>,
}

pub struct BlockStore {
    inner: Arc<Inner>,
    rt: tokio::runtime::Runtime,
    block_size: usize,
    concurrency: usize,
}

/// Per open file: notices sequential reading, to fetch whole blocks and
/// prefetch the next ones (into the cache), and holds the block last read
/// when there is no cache. A random reader fetches only the bytes asked
/// (and, with a cache, the whole block follows in the background).
pub struct ReadAhead {
    next: u64,
    window: u64,
    max_window: u64,
    prefetched_to: u64,
    hold: Option<(BlockId, Bytes)>,
}

impl ReadAhead {
    /// Prefetching up to `max_window` bytes ahead of a sequential reader.
    pub fn new(max_window: u64) -> ReadAhead {
        ReadAhead {
            next: 0,
            window: 0,
            max_window,
            prefetched_to: 0,
            hold: None,
        }
    }

    /// Record a read; whether it continues a sequential stream (a read at
    /// 0 starts one). Kernel readahead runs a few requests in parallel, so
    /// "continues" allows some reordering.
    fn observe(&mut self, off: u64, len: u64) -> bool {
        const SLACK: u64 = 1 << 20;
        let seq = off == 0 || (off + SLACK >= self.next && off <= self.next + SLACK);
        if seq {
            self.window = (self.window * 2).max(len.max(1 << 20)).min(self.max_window);
        } else {
            self.window = 0;
            self.prefetched_to = 0;
        }
        self.next = self.next.max(off + len);
        if !seq {
            self.next = off + len;
        }
        seq
    }

    /// The range to prefetch now, past what was asked before.
    fn ahead(&mut self, end: u64) -> Option<Range<u64>> {
        if self.window == 0 {
            return None;
        }
        let from = self.prefetched_to.max(end);
        let to = end + self.window;
        (to > from).then(|| {
            self.prefetched_to = to;
            from..to
        })
    }
}

impl BlockStore {
    /// Open the store described by `cfg` (no request is sent: see
    /// [`BlockStore::check`]) and its cache.
    pub fn open(cfg: &BlockConfig) -> BlockResult<BlockStore> {
        let (builder, endpoint) = config::builder(cfg).map_err(BlockError::Config)?;
        let s3 = builder
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(endpoint.starts_with("http://"))
                    .with_timeout(cfg.request_timeout)
                    .with_connect_timeout(Duration::from_secs(5)),
            )
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(2),
                    base: 2.0,
                },
                max_retries: 1000,
                retry_timeout: cfg.retry_budget,
            })
            .build()
            .map_err(|e| BlockError::Config(format!("S3 client for {}: {e}", cfg.location)))?;
        let shown = format!("{} at {endpoint}", cfg.location);
        let cache = match &cfg.cache_dir {
            Some(dir) if cfg.cache_size > 0 => {
                // One subdirectory per store, so two filesystems never
                // share entries.
                let ns = format!("{endpoint}|{}", cfg.location);
                let sub = dir.join(format!("{:08x}", crc32fast::hash(ns.as_bytes())));
                Some(BlockCache::open(&sub, cfg.cache_size).map_err(|e| {
                    BlockError::Config(format!("block cache {}: {e}", sub.display()))
                })?)
            }
            _ => None,
        };
        let root = match cfg.location.prefix.as_str() {
            "" => "blocks".to_string(),
            p => format!("{p}/blocks"),
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("esfs-s3")
            .enable_all()
            .build()
            .map_err(|e| BlockError::Io(format!("tokio runtime: {e}")))?;
        let n = cfg.concurrency.max(1);
        Ok(BlockStore {
            inner: Arc::new(Inner {
                s3,
                root,
                shown,
                budget: cfg.retry_budget,
                cache,
                uploads: Semaphore::new(n),
                downloads: Semaphore::new(n),
                inflight: Mutex::new(HashMap::new()),
                pending: Mutex::new(HashMap::new()),
                streamed: Mutex::new(VecDeque::new()),
                backlog: 2 * n,
            }),
            rt,
            block_size: cfg.block_size.max(1),
            concurrency: n,
        })
    }

    /// "s3://BUCKET/PREFIX at ENDPOINT".
    pub fn describe(&self) -> &str {
        &self.inner.shown
    }

    pub fn cache(&self) -> Option<&BlockCache> {
        self.inner.cache.as_ref()
    }

    /// Wait until the blocks on their way into the cache are written
    /// (tests, unmount).
    pub fn settle(&self) {
        while !self.inner.pending.lock().is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Requests in flight at once (uploads and downloads each).
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// One listing request: the bucket exists and the credentials work.
    pub fn check(&self) -> BlockResult<()> {
        let inner = &self.inner;
        let root = ObjPath::from(inner.root.as_str());
        self.rt.block_on(async {
            match inner.s3.list(Some(&root)).next().await {
                None | Some(Ok(_)) => Ok(()),
                Some(Err(e)) => Err(inner.error("LIST", &inner.root, e)),
            }
        })
    }

    /// Upload `data`, the bytes of `file` at `off`, as fresh blocks (cut at
    /// multiples of the block size, uploaded in parallel): the extents to
    /// give [`BlockMap::write`]. Nothing refers to the blocks until that
    /// map is committed; on failure the blocks already uploaded are
    /// deleted in the background (what a crash leaves, fsck finds).
    pub fn put(&self, file: &str, off: u64, data: Bytes) -> BlockResult<Vec<Extent>> {
        self.put_ranges(file, vec![(off, data)])
    }

    /// [`BlockStore::put`] of several ranges (sorted, not overlapping) at
    /// once, all their blocks in parallel. The blocks are kept in the cache
    /// too: small writes are read again soon (the indexer, another open).
    pub fn put_ranges(&self, file: &str, ranges: Vec<(u64, Bytes)>) -> BlockResult<Vec<Extent>> {
        check_key(file)?;
        let pieces = self.cut(ranges);
        self.rt.block_on(
            self.inner
                .clone()
                .put_pieces(file.to_string(), pieces, true),
        )
    }

    /// [`BlockStore::put`] in the background: `done` gets its result (on
    /// one of this store's threads), so a writer can go on while its
    /// blocks upload. Not kept in the cache: these are a big write's whole
    /// blocks, which would cost the cache disk as much as the upload (as
    /// JuiceFS, whose `--cache-large-write` is off by default; measured
    /// here: 1 GiB written at 123 MB/s with the copy to the cache, 172
    /// without).
    pub fn spawn_put(
        &self,
        file: &str,
        off: u64,
        data: Bytes,
        done: impl FnOnce(BlockResult<Vec<Extent>>) + Send + 'static,
    ) {
        // `done` is never called here: the caller may hold what it locks.
        let checked = check_key(file);
        let pieces = self.cut(vec![(off, data)]);
        let (inner, file) = (self.inner.clone(), file.to_string());
        self.rt.spawn(async move {
            match checked {
                Ok(()) => done(inner.put_pieces(file, pieces, false).await),
                Err(e) => done(Err(e)),
            }
        });
    }

    /// Ranges as pieces cut at multiples of the block size, each to be a
    /// fresh block.
    fn cut(&self, ranges: Vec<(u64, Bytes)>) -> Vec<(Extent, Bytes)> {
        let bs = self.block_size as u64;
        let mut pieces = Vec::new();
        for (off, data) in ranges {
            let mut at = 0u64;
            while at < data.len() as u64 {
                let pos = off + at;
                let len = (bs - pos % bs).min(data.len() as u64 - at);
                let extent = Extent {
                    off: pos,
                    len,
                    block: BlockId::fresh(),
                    at: 0,
                };
                pieces.push((extent, data.slice(at as usize..(at + len) as usize)));
                at += len;
            }
        }
        pieces
    }

    /// Read `file`'s bytes at `off` into `buf` as `map` describes them:
    /// how many bytes the map holds there (holes read as zeros; fewer past
    /// the map's end, where the caller zero-fills up to the file's size).
    pub fn read(
        &self,
        file: &str,
        map: &BlockMap,
        off: u64,
        buf: &mut [u8],
        ra: &mut ReadAhead,
    ) -> BlockResult<usize> {
        check_key(file)?;
        let pieces = map.pieces(off, buf.len() as u64);
        let n = pieces.last().map_or(0, |p| (p.off + p.len - off) as usize);
        let seq = ra.observe(off, buf.len() as u64);
        let inner = &self.inner;
        let stream = seq
            && inner
                .cache
                .as_ref()
                .is_some_and(|c| map.end() > c.capacity() / 2);
        let mut misses = Vec::new();
        for p in &pieces {
            let dst = &mut buf[(p.off - off) as usize..(p.off - off + p.len) as usize];
            let Some((block, at)) = p.source else {
                dst.fill(0);
                continue;
            };
            if let Some((b, data)) = &ra.hold
                && *b == block
                && data.len() as u64 >= at + p.len
            {
                dst.copy_from_slice(&data[at as usize..(at + p.len) as usize]);
                continue;
            }
            let name = cache_name(file, block);
            if let Some(data) = inner.held(&name)
                && data.len() as u64 >= at + p.len
            {
                dst.copy_from_slice(&data[at as usize..(at + p.len) as usize]);
                continue;
            }
            if let Some(c) = &inner.cache {
                match c.read_at(&name, at, dst) {
                    Ok(Some(k)) if k == dst.len() => continue,
                    Ok(_) => {}
                    Err(e) => log::warn!("block cache read of {}: {e}", cache_name(file, block)),
                }
            }
            misses.push(*p);
        }
        if !misses.is_empty() {
            let fetched = self.rt.block_on(futures_util::future::try_join_all(
                misses
                    .iter()
                    .map(|p| inner.fetch_piece(file, p, seq, stream)),
            ))?;
            for (p, data) in misses.iter().zip(fetched) {
                let (block, at) = p.source.expect("a block piece");
                let dst = &mut buf[(p.off - off) as usize..(p.off - off + p.len) as usize];
                let start = if data.whole { at as usize } else { 0 };
                dst.copy_from_slice(&data.bytes[start..start + p.len as usize]);
                if data.whole && inner.cache.is_none() {
                    ra.hold = Some((block, data.bytes));
                }
            }
        }
        if seq && inner.cache.is_some() {
            self.prefetch(file, map, ra, off + n as u64, stream);
        } else if inner.cache.is_some() {
            // A random reader got its range; the whole block follows into
            // the cache in the background, for the reads that land near
            // (as JuiceFS's fetcher does).
            for p in &misses {
                let (block, _) = p.source.expect("a block piece");
                self.fetch_behind(file, block, false);
            }
        }
        Ok(n)
    }

    /// Fetch a whole block into the cache (or, `stream`ing, memory) in the
    /// background, unless it is there or on its way.
    fn fetch_behind(&self, file: &str, block: BlockId, stream: bool) {
        let name = cache_name(file, block);
        let inner = self.inner.clone();
        if inner.cache.as_ref().is_some_and(|c| c.contains(&name))
            || inner.inflight.lock().contains_key(&name)
            || (stream && inner.held(&name).is_some())
        {
            return;
        }
        let file = file.to_string();
        self.rt.spawn(async move {
            if let Err(e) = inner.fetch_whole(&file, block, stream).await {
                log::debug!("prefetch of {name}: {e}");
            }
        });
    }

    /// Start fetching, into the cache, the blocks a sequential reader at
    /// `end` will want next.
    fn prefetch(&self, file: &str, map: &BlockMap, ra: &mut ReadAhead, end: u64, stream: bool) {
        let Some(r) = ra.ahead(end) else { return };
        for block in map.blocks_in(r.start, r.end - r.start) {
            self.fetch_behind(file, block, stream);
        }
    }

    /// A whole block (through the cache).
    pub fn get_block(&self, file: &str, block: BlockId) -> BlockResult<Bytes> {
        check_key(file)?;
        if let Some(c) = &self.inner.cache
            && let Ok(Some(v)) = c.get(&cache_name(file, block))
        {
            return Ok(Bytes::from(v));
        }
        self.rt.block_on(self.inner.fetch_whole(file, block, false))
    }

    /// Bytes `range` of a block, straight from the store.
    pub fn get_range(&self, file: &str, block: BlockId, range: Range<u64>) -> BlockResult<Bytes> {
        check_key(file)?;
        let inner = &self.inner;
        self.rt.block_on(inner.get_range(file, block, range))
    }

    /// Delete blocks (those already gone count as deleted), from the
    /// cache too.
    pub fn delete(&self, file: &str, blocks: &[BlockId]) -> BlockResult<()> {
        check_key(file)?;
        self.rt.block_on(self.inner.delete(file, blocks))
    }

    /// Delete every block of `file` (the file is gone): how many.
    pub fn delete_file(&self, file: &str) -> BlockResult<usize> {
        let blocks: Vec<BlockId> = self.list_file(file)?.into_iter().map(|m| m.block).collect();
        self.delete(file, &blocks)?;
        Ok(blocks.len())
    }

    /// The object beside the blocks naming the filesystem they belong to
    /// (`PREFIX/esfs-fsid`, as a data directory's `esfs-fsid` file): its
    /// bytes, None when absent.
    pub fn stamp(&self) -> BlockResult<Option<Bytes>> {
        let inner = &self.inner;
        let path = inner.stamp_path();
        self.rt.block_on(async {
            match inner.s3.get(&path).await {
                Ok(r) => r
                    .bytes()
                    .await
                    .map(Some)
                    .map_err(|e| inner.error("GET", path.as_ref(), e)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(inner.error("GET", path.as_ref(), e)),
            }
        })
    }

    /// Write the stamp (see [`BlockStore::stamp`]).
    pub fn set_stamp(&self, data: Bytes) -> BlockResult<()> {
        let inner = &self.inner;
        let path = inner.stamp_path();
        self.rt.block_on(async {
            inner
                .s3
                .put(&path, PutPayload::from(data))
                .await
                .map(drop)
                .map_err(|e| inner.error("PUT", path.as_ref(), e))
        })
    }

    /// Every block in the store (for fsck); objects under the blocks
    /// prefix that are not blocks are skipped with a warning.
    pub fn list(&self) -> BlockResult<Vec<BlockMeta>> {
        self.rt.block_on(self.inner.list(None))
    }

    /// Every block of one file.
    pub fn list_file(&self, file: &str) -> BlockResult<Vec<BlockMeta>> {
        check_key(file)?;
        self.rt.block_on(self.inner.list(Some(file)))
    }
}

/// What a fetch brought: a whole block, or just the piece asked for.
struct Fetched {
    bytes: Bytes,
    whole: bool,
}

impl Inner {
    fn path(&self, file: &str, block: BlockId) -> ObjPath {
        ObjPath::from(format!("{}/{file}/{block}", self.root))
    }

    /// A block on its way into the cache or streamed, from memory.
    fn held(&self, name: &str) -> Option<Bytes> {
        if let Some(b) = self.pending.lock().get(name) {
            return Some(b.clone());
        }
        let streamed = self.streamed.lock();
        streamed
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.clone())
    }

    /// Put a block in the cache, if there is one, in the background; or,
    /// `stream`ing, in memory only (see `streamed`).
    fn keep(self: &Arc<Self>, name: &str, data: &Bytes, stream: bool) {
        if self.cache.is_none() {
            return;
        }
        if stream {
            let mut streamed = self.streamed.lock();
            if streamed.len() >= self.backlog {
                streamed.pop_front();
            }
            streamed.push_back((name.to_string(), data.clone()));
            return;
        }
        {
            let mut pending = self.pending.lock();
            if pending.len() >= self.backlog || pending.contains_key(name) {
                return;
            }
            pending.insert(name.to_string(), data.clone());
        }
        let (inner, name, data) = (self.clone(), name.to_string(), data.clone());
        tokio::task::spawn_blocking(move || {
            if let Some(c) = &inner.cache
                && let Err(e) = c.insert(&name, &data)
            {
                log::warn!("block cache: {e}");
            }
            inner.pending.lock().remove(&name);
        });
    }

    /// Upload the pieces as blocks, in parallel: their extents. On failure
    /// the blocks already uploaded are deleted in the background (what a
    /// crash leaves, fsck finds).
    async fn put_pieces(
        self: Arc<Self>,
        file: String,
        pieces: Vec<(Extent, Bytes)>,
        keep: bool,
    ) -> BlockResult<Vec<Extent>> {
        let done = Mutex::new(Vec::new());
        let uploads = pieces.iter().map(|(e, d)| async {
            self.upload(&file, e.block, d.clone(), keep).await?;
            done.lock().push(e.block);
            Ok::<_, BlockError>(())
        });
        if let Err(e) = futures_util::future::try_join_all(uploads).await {
            let ids = std::mem::take(&mut *done.lock());
            if !ids.is_empty() {
                let inner = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = inner.delete(&file, &ids).await {
                        log::info!("uncommitted blocks of {file} left for fsck: {e}");
                    }
                });
            }
            return Err(e);
        }
        Ok(pieces.into_iter().map(|(e, _)| e).collect())
    }

    async fn upload(
        self: &Arc<Self>,
        file: &str,
        block: BlockId,
        data: Bytes,
        keep: bool,
    ) -> BlockResult<()> {
        let path = self.path(file, block);
        {
            let _permit = self.uploads.acquire().await.expect("never closed");
            // A plain PUT: the name is fresh, and a retried PUT whose first
            // attempt landed must succeed (a create-only PUT would fail it).
            self.s3
                .put(&path, PutPayload::from(data.clone()))
                .await
                .map_err(|e| self.error("PUT", path.as_ref(), e))?;
        }
        if keep {
            self.keep(&cache_name(file, block), &data, false);
        }
        Ok(())
    }

    /// A miss of [`BlockStore::read`]: the whole block when reading
    /// sequentially (kept in the cache, or in memory when `stream`ing),
    /// else just the piece.
    async fn fetch_piece(
        self: &Arc<Self>,
        file: &str,
        p: &Piece,
        seq: bool,
        stream: bool,
    ) -> BlockResult<Fetched> {
        let (block, at) = p.source.expect("a block piece");
        if seq {
            let bytes = self.fetch_whole(file, block, stream).await?;
            if (bytes.len() as u64) < at + p.len {
                return Err(self.short(file, block, bytes.len() as u64, at + p.len));
            }
            return Ok(Fetched { bytes, whole: true });
        }
        let bytes = self.get_range(file, block, at..at + p.len).await?;
        Ok(Fetched {
            bytes,
            whole: false,
        })
    }

    /// Download a whole block once (concurrent askers wait for the first)
    /// and keep it in the cache (`stream`ing: in memory).
    async fn fetch_whole(
        self: &Arc<Self>,
        file: &str,
        block: BlockId,
        stream: bool,
    ) -> BlockResult<Bytes> {
        let name = cache_name(file, block);
        let lock = self
            .inflight
            .lock()
            .entry(name.clone())
            .or_default()
            .clone();
        let _turn = lock.lock().await;
        if let Some(b) = self.held(&name) {
            return Ok(b);
        }
        if let Some(c) = &self.cache
            && let Ok(Some(v)) = tokio::task::block_in_place(|| c.get(&name))
        {
            return Ok(Bytes::from(v));
        }
        let path = self.path(file, block);
        let got = async {
            let _permit = self.downloads.acquire().await.expect("never closed");
            self.s3.get(&path).await?.bytes().await
        }
        .await;
        let got = got.map_err(|e| self.error("GET", path.as_ref(), e));
        if let Ok(bytes) = &got {
            self.keep(&name, bytes, stream);
        }
        // Waiters hold their clone of the lock; later askers find the
        // block pending or cached, or, after a failure, try again.
        self.inflight.lock().remove(&name);
        got
    }

    async fn get_range(&self, file: &str, block: BlockId, range: Range<u64>) -> BlockResult<Bytes> {
        let path = self.path(file, block);
        let want = range.end;
        let got = {
            let _permit = self.downloads.acquire().await.expect("never closed");
            self.s3.get_range(&path, range.clone()).await
        };
        let bytes = got.map_err(|e| self.error("GET", path.as_ref(), e))?;
        if (bytes.len() as u64) < range.end - range.start {
            return Err(self.short(file, block, range.start + bytes.len() as u64, want));
        }
        Ok(bytes)
    }

    async fn delete(&self, file: &str, blocks: &[BlockId]) -> BlockResult<()> {
        if let Some(c) = &self.cache {
            for b in blocks {
                c.remove(&cache_name(file, *b));
            }
        }
        let paths = futures_util::stream::iter(
            blocks
                .iter()
                .map(|b| Ok(self.path(file, *b)))
                .collect::<Vec<_>>(),
        )
        .boxed();
        let mut results = self.s3.delete_stream(paths);
        while let Some(r) = results.next().await {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.error("DELETE", &format!("{}/{file}", self.root), e)),
            }
        }
        Ok(())
    }

    async fn list(&self, file: Option<&str>) -> BlockResult<Vec<BlockMeta>> {
        let dir = match file {
            Some(f) => format!("{}/{f}", self.root),
            None => self.root.clone(),
        };
        let metas: Vec<_> = self
            .s3
            .list(Some(&ObjPath::from(dir.as_str())))
            .try_collect()
            .await
            .map_err(|e| self.error("LIST", &dir, e))?;
        let mut out = Vec::with_capacity(metas.len());
        for m in metas {
            let loc = m.location.as_ref();
            let rest = loc
                .strip_prefix(&self.root)
                .and_then(|r| r.strip_prefix('/'));
            match rest.and_then(|r| r.split_once('/')) {
                Some((f, b)) if !b.contains('/') && b.parse::<BlockId>().is_ok() => {
                    out.push(BlockMeta {
                        file: f.to_string(),
                        block: b.parse().expect("checked"),
                        size: m.size,
                    })
                }
                _ => log::warn!("{}: {loc} is not a block (left alone)", self.shown),
            }
        }
        Ok(out)
    }

    fn short(&self, file: &str, block: BlockId, have: u64, want: u64) -> BlockError {
        BlockError::Corrupt(format!(
            "block {}/{file}/{block} in {} ends at {have}, its map needs {want} bytes",
            self.root, self.shown
        ))
    }

    /// An object_store failure as one line naming the store, the request
    /// and the cause.
    fn stamp_path(&self) -> ObjPath {
        match self.root.strip_suffix("blocks") {
            Some(prefix) => ObjPath::from(format!("{prefix}esfs-fsid")),
            None => ObjPath::from("esfs-fsid"),
        }
    }

    fn error(&self, op: &str, what: &str, e: object_store::Error) -> BlockError {
        let cause = crate::causes::error_chain(&e);
        match e {
            object_store::Error::NotFound { .. } => {
                BlockError::Missing(format!("{op} {what}: not found in {}", self.shown))
            }
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => {
                BlockError::Denied(format!("{} refused {op} {what}: {cause}", self.shown))
            }
            _ if transient(&e) => BlockError::Unavailable(format!(
                "object store {} unavailable (retry budget {} s): {op} {what}: {cause}",
                self.shown,
                self.budget.as_secs_f64()
            )),
            _ if cause.contains("NoSuchBucket") => {
                BlockError::Config(format!("{}: no such bucket", self.shown))
            }
            _ => BlockError::Io(format!("{}: {op} {what}: {cause}", self.shown)),
        }
    }
}

/// A failure object_store retried and gave up on: transport errors, 5xx,
/// throttling.
fn transient(e: &object_store::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if c.downcast_ref::<object_store::client::HttpError>()
            .is_some()
        {
            return true;
        }
        cur = c.source();
    }
    let m = e.to_string();
    m.contains("status code: 5") || m.contains("status code: 429")
}

/// A file key names one directory level of object names.
fn check_key(file: &str) -> BlockResult<()> {
    let ok = !file.is_empty()
        && file
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && file != "."
        && file != "..";
    if ok {
        Ok(())
    } else {
        Err(BlockError::Config(format!("bad content key {file:?}")))
    }
}

/// A block's name in the cache: unique (block ids are), and ending in the
/// block id's random digits, on which the cache fans out.
fn cache_name(file: &str, block: BlockId) -> String {
    format!("{file}-{block}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readahead_follows_sequential_readers_only() {
        let mut ra = ReadAhead::new(8 << 20);
        assert!(ra.observe(0, 128 << 10));
        assert_eq!(
            ra.ahead(128 << 10),
            Some((128 << 10)..(128 << 10) + (1 << 20))
        );
        assert!(ra.observe(128 << 10, 128 << 10));
        // The window doubled; only what lies past the last prefetch is new.
        assert_eq!(
            ra.ahead(256 << 10),
            Some(((128 << 10) + (1 << 20))..(256 << 10) + (2 << 20))
        );
        for i in 2..40u64 {
            assert!(ra.observe(i * (128 << 10), 128 << 10));
        }
        assert_eq!(ra.window, 8 << 20);
        // A jump far away is random: no prefetch.
        assert!(!ra.observe(900 << 20, 4096));
        assert_eq!(ra.ahead((900 << 20) + 4096), None);
        assert!(!ra.observe(100 << 20, 4096));
        // ... until it reads on from there.
        assert!(ra.observe((100 << 20) + 4096, 4096));
    }

    #[test]
    fn errors_keep_their_kind_and_keys_are_one_level() {
        let io: std::io::Error = BlockError::Unavailable("down".into()).into();
        assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
        assert!(check_key("123").is_ok() && check_key("a/b").is_err() && check_key("").is_err());
    }
}
